#include "llm/bpe_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <cstring>
#include <queue>
#include <sstream>

#include "ir/error.h"

namespace kiln::llm {

namespace {

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else if (cp < 0x800) s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
    else s += static_cast<char>(0xE0 | (cp >> 12)), s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
    return s;
}

// Splits a UTF-8 string into its characters (each as its bytes).
std::vector<std::string> utf8Chars(const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
        out.push_back(s.substr(i, n));
        i += n;
    }
    return out;
}

bool isLetter(unsigned char c) { return std::isalpha(c) || c >= 0x80; }
bool isDigit(unsigned char c) { return std::isdigit(c); }
bool isSpace(unsigned char c) { return std::isspace(c); }

}  // namespace

BpeTokenizer BpeTokenizer::parse(const std::string& json_text, const std::string& where) {
    try {
        return parseJson(nlohmann::json::parse(json_text, nullptr, false), where);
    } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type
        throw Error(where + ": " + e.what());
    }
}

BpeTokenizer BpeTokenizer::parseJson(const nlohmann::json& j, const std::string& where) {
    check(j.is_object() && j.contains("model") && j["model"].is_object(), where + ": not a tokenizer.json (no 'model')");
    const auto& m = j["model"];
    check(m.value("type", "") == "BPE", where + ": only BPE models are supported here (Llama-style SentencePiece models come separately)");
    check(m.contains("vocab") && m["vocab"].is_object() && m.contains("merges") && m["merges"].is_array(), where + ": BPE model needs vocab and merges");
    BpeTokenizer t;
    for (const auto& [token, id] : m["vocab"].items()) {
        check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t(1) << 24), where + ": bad id for token " + token);
        t.vocab_[token] = id.get<int64_t>();
        if (static_cast<int64_t>(t.id_to_token_.size()) <= id.get<int64_t>()) t.id_to_token_.resize(id.get<int64_t>() + 1);
        t.id_to_token_[id.get<int64_t>()] = token;
    }
    int64_t rank = 0;
    for (const auto& merge : m["merges"]) {
        std::string a, b;
        if (merge.is_string()) {
            const std::string s = merge.get<std::string>();
            const size_t sp = s.find(' ');
            check(sp != std::string::npos && sp > 0, where + ": bad merge '" + s + "'");
            a = s.substr(0, sp), b = s.substr(sp + 1);
        } else {
            check(merge.is_array() && merge.size() == 2, where + ": bad merge " + merge.dump());
            a = merge[0], b = merge[1];
        }
        t.ranks_.emplace(std::make_pair(a, b), rank++);
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
        for (const auto& a : j["added_tokens"]) {
            const std::string content = a.value("content", "");
            check(!a.contains("id") || (a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 && a["id"].get<int64_t>() < (int64_t(1) << 24)),
                  where + ": added token '" + content + "' has a bad id " + (a.contains("id") ? a["id"].dump() : ""));
            const int64_t id = a.value("id", int64_t(-1));
            if (content.empty() || id < 0) continue;
            t.added_.emplace_back(content, id);
            if (a.contains("special") && a["special"].is_boolean() && a["special"].get<bool>()) t.special_.insert(id);
            if (static_cast<int64_t>(t.id_to_token_.size()) <= id) t.id_to_token_.resize(id + 1);
            t.id_to_token_[id] = content;
        }
    // GPT-2's byte alphabet: printable bytes stand for themselves, the rest map to 256+.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        t.byte_to_char_[b] = utf8(printable ? static_cast<uint32_t>(b) : next++);
        t.char_to_byte_[t.byte_to_char_[b]] = static_cast<unsigned char>(b);
    }
    // Each character of a piece stands for one byte (pieces outside the byte alphabet for
    // at most their own bytes), and added tokens for their content.
    for (const auto& piece : t.id_to_token_) t.max_token_bytes_ = std::max(t.max_token_bytes_, piece.size());
    return t;
}

BpeTokenizer BpeTokenizer::load(const std::filesystem::path& path) {
    std::ifstream in(path);
    check(in.good(), path.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse(ss.str(), path.string());
}

// GPT-2's pre-tokenization: contractions, " ?letters", " ?digits", " ?other", and
// whitespace runs (a run before a word leaves its last space to the word).
std::vector<std::string> BpeTokenizer::splitWords(const std::string& text) const {
    std::vector<std::string> words;
    const size_t n = text.size();
    size_t i = 0;
    auto u = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    while (i < n) {
        if (text[i] == '\'') {
            bool matched = false;
            for (const char* c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"})
                if (text.compare(i, std::strlen(c), c) == 0) {
                    words.emplace_back(c);
                    i += std::strlen(c);
                    matched = true;
                    break;
                }
            if (matched) continue;
        }
        size_t start = i;
        if (text[i] == ' ' && i + 1 < n && !isSpace(u(i + 1))) ++i;  // a single leading space joins the word
        if (i < n && isLetter(u(i))) {
            while (i < n && isLetter(u(i))) ++i;
        } else if (i < n && isDigit(u(i))) {
            while (i < n && isDigit(u(i))) ++i;
        } else if (i < n && !isSpace(u(i))) {
            while (i < n && !isSpace(u(i)) && !isLetter(u(i)) && !isDigit(u(i))) ++i;
        } else {
            i = start;
            while (i < n && isSpace(u(i))) ++i;
            if (i < n && i - start > 1 && text[i - 1] == ' ') --i;  // \s+(?!\S): leave one space for the next word
        }
        words.push_back(text.substr(start, i - start));
    }
    return words;
}

// Merges by rank as Hugging Face's BPE does (lowest rank first, leftmost among equals),
// through a heap of candidate pairs, so that a long word costs O(n log n), not O(n^2).
std::vector<int64_t> BpeTokenizer::encodeWord(const std::string& word) const {
    struct Symbol {
        std::string text;
        int64_t prev, next;
        bool alive = true;
    };
    std::vector<Symbol> sym;
    for (size_t k = 0; k < word.size(); ++k)
        sym.push_back({byte_to_char_[static_cast<unsigned char>(word[k])], static_cast<int64_t>(k) - 1, k + 1 < word.size() ? static_cast<int64_t>(k) + 1 : -1});
    struct Candidate {
        int64_t rank, left, right;
        size_t left_size, right_size;  // the pair as it was when queued; a later merge changes a size
        bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](int64_t left) {
        if (left < 0 || sym[left].next < 0) return;
        const int64_t right = sym[left].next;
        auto it = ranks_.find({sym[left].text, sym[right].text});
        if (it != ranks_.end()) heap.push({it->second, left, right, sym[left].text.size(), sym[right].text.size()});
    };
    for (int64_t k = 0; k + 1 < static_cast<int64_t>(sym.size()); ++k) push(k);
    while (!heap.empty()) {
        const Candidate c = heap.top();
        heap.pop();
        Symbol& l = sym[c.left];
        if (!l.alive || l.next != c.right || l.text.size() != c.left_size || sym[c.right].text.size() != c.right_size) continue;  // stale
        Symbol& r = sym[c.right];
        l.text += r.text;
        r.alive = false;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.left;
        push(l.prev);
        push(c.left);
    }
    std::vector<int64_t> ids;
    for (int64_t k = sym.empty() ? -1 : 0; k >= 0; k = sym[k].next) {
        auto it = vocab_.find(sym[k].text);
        check(it != vocab_.end(), "tokenizer: no id for piece '" + sym[k].text + "' (incomplete byte alphabet in the vocabulary?)");
        ids.push_back(it->second);
    }
    return ids;
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
    std::vector<int64_t> ids;
    size_t i = 0, plain = 0;
    auto flush = [&](size_t end) {
        for (const auto& w : splitWords(text.substr(plain, end - plain)))
            for (int64_t id : encodeWord(w)) ids.push_back(id);
    };
    while (i < text.size()) {  // special tokens are matched verbatim first
        bool special = false;
        for (const auto& [content, id] : added_)
            if (text.compare(i, content.size(), content) == 0) {
                flush(i);
                ids.push_back(id);
                i += content.size();
                plain = i;
                special = true;
                break;
            }
        if (!special) ++i;
    }
    flush(text.size());
    return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
    std::string out;
    for (int64_t id : ids) {
        if (id < 0 || id >= vocabSize()) {  // a model may have more rows than its tokenizer has pieces
            out += "\xEF\xBF\xBD";
            continue;
        }
        bool special = false;
        for (const auto& [content, sid] : added_)
            if (sid == id) out += content, special = true;
        if (special) continue;
        for (const auto& ch : utf8Chars(id_to_token_[id])) {
            auto it = char_to_byte_.find(ch);
            out += it == char_to_byte_.end() ? ch : std::string(1, static_cast<char>(it->second));
        }
    }
    return out;
}

}  // namespace kiln::llm
