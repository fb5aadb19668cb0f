#include "llm/sentencepiece_tokenizer.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "ir/error.h"

namespace kiln::llm {

namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

// A protobuf wire-format reader over one message's bytes.
class Wire {
public:
    Wire(std::string_view bytes, const std::string& where) : p_(bytes), where_(where) {}
    bool done() const { return pos_ >= p_.size(); }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            check(pos_ < p_.size(), where_ + ": truncated protobuf varint");
            const uint8_t b = static_cast<uint8_t>(p_[pos_++]);
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        throw Error(where_ + ": malformed protobuf varint");
    }
    std::string_view bytes(size_t n) {
        check(n <= p_.size() - pos_, where_ + ": truncated protobuf field");
        auto s = p_.substr(pos_, n);
        pos_ += n;
        return s;
    }
    // Reads the next field; returns its number and wire type (the value is read by the caller).
    std::pair<uint32_t, int> tag() {
        const uint64_t t = varint();
        return {static_cast<uint32_t>(t >> 3), static_cast<int>(t & 7)};
    }
    std::string_view lengthDelimited() { return bytes(static_cast<size_t>(varint())); }
    float fixed32() {
        uint32_t bits;
        std::memcpy(&bits, bytes(4).data(), 4);
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }
    void skip(int wire_type) {
        switch (wire_type) {
            case 0: varint(); break;
            case 1: bytes(8); break;
            case 2: lengthDelimited(); break;
            case 5: bytes(4); break;
            default: throw Error(where_ + ": unsupported protobuf wire type " + std::to_string(wire_type));
        }
    }

private:
    std::string_view p_;
    size_t pos_ = 0;
    const std::string& where_;
};

size_t utf8Length(unsigned char lead) { return lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1; }

// The length of the well-formed UTF-8 character text starts with, or 0 (overlong forms,
// surrogates and code points past U+10FFFF are malformed, as sentencepiece decides).
size_t validUtf8Length(std::string_view text) {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
    const size_t len = utf8Length(byte(0));
    if (len == 1) return byte(0) < 0x80 ? 1 : 0;
    if (text.size() < len) return 0;
    uint32_t cp = byte(0) & (0x7f >> len);
    for (size_t i = 1; i < len; ++i) {
        if ((byte(i) & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (byte(i) & 0x3f);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

}  // namespace

SentencePieceTokenizer SentencePieceTokenizer::load(const std::filesystem::path& model_file) {
    std::ifstream in(model_file, std::ios::binary);
    check(in.good(), model_file.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse(ss.str(), model_file.string());
}

SentencePieceTokenizer SentencePieceTokenizer::parse(const std::string& data, const std::string& where) {
    SentencePieceTokenizer t;
    Wire model(data, where);
    int64_t model_type = 1;  // proto default: UNIGRAM
    bool remove_extra_whitespace = true;
    while (!model.done()) {
        auto [field, wt] = model.tag();
        if (field == 1 && wt == 2) {  // SentencePiece
            Wire p(model.lengthDelimited(), where);
            Piece piece;
            while (!p.done()) {
                auto [f, w] = p.tag();
                if (f == 1 && w == 2) piece.text = std::string(p.lengthDelimited());
                else if (f == 2 && w == 5) piece.score = p.fixed32();
                else if (f == 3 && w == 0) piece.type = static_cast<PieceType>(p.varint());
                else p.skip(w);
            }
            check(static_cast<int>(piece.type) >= 1 && static_cast<int>(piece.type) <= 6, where + ": piece '" + piece.text + "' has an unknown type");
            t.pieces_.push_back(std::move(piece));
        } else if (field == 2 && wt == 2) {  // TrainerSpec
            Wire s(model.lengthDelimited(), where);
            while (!s.done()) {
                auto [f, w] = s.tag();
                if (f == 3 && w == 0) model_type = static_cast<int64_t>(s.varint());
                else if (f == 35 && w == 0) t.byte_fallback_ = s.varint() != 0;
                else s.skip(w);
            }
        } else if (field == 3 && wt == 2) {  // NormalizerSpec
            Wire s(model.lengthDelimited(), where);
            while (!s.done()) {
                auto [f, w] = s.tag();
                if (f == 2 && w == 2) t.readCharsmap(s.lengthDelimited(), where);
                else if (f == 3 && w == 0) t.add_dummy_prefix_ = s.varint() != 0;
                else if (f == 4 && w == 0) remove_extra_whitespace = s.varint() != 0;
                else if (f == 5 && w == 0) t.escape_whitespace_ = s.varint() != 0;
                else s.skip(w);
            }
        } else {
            model.skip(wt);
        }
    }
    check(!t.pieces_.empty(), where + ": no pieces (not a SentencePiece model?)");
    check(model_type == 1 || model_type == 2, where + ": model type " + std::to_string(model_type) + " is not supported (unigram and BPE are)");
    t.unigram_ = model_type == 1;
    t.remove_extra_whitespace_ = remove_extra_whitespace;
    std::fill(std::begin(t.byte_piece_), std::end(t.byte_piece_), -1);
    for (int64_t i = 0; i < static_cast<int64_t>(t.pieces_.size()); ++i) {
        Piece& p = t.pieces_[i];
        t.index_.emplace(p.text, i);
        t.max_piece_bytes_ = std::max(t.max_piece_bytes_, p.text.size());
        if (p.type == PieceType::Unknown) t.unk_ = i;
        if (p.type == PieceType::Control && p.text == "<s>") t.bos_ = i;
        if (p.type == PieceType::UserDefined) t.user_defined_.push_back(p.text);
        int byte = 0;
        if (p.type == PieceType::Byte && p.text.size() == 6 && p.text.rfind("<0x", 0) == 0 && p.text[5] == '>' &&
            std::from_chars(p.text.data() + 3, p.text.data() + 5, byte, 16).ptr == p.text.data() + 5)
            p.byte = byte, t.byte_piece_[byte] = i;
    }
    return t;
}

void SentencePieceTokenizer::appendSymbol(const std::string& symbol, std::vector<int64_t>& out) const {
    auto it = index_.find(symbol);
    if (it != index_.end() && pieces_[it->second].type != PieceType::Unused) {
        out.push_back(it->second);
        return;
    }
    bool bytes_ok = byte_fallback_;
    for (unsigned char b : symbol) bytes_ok = bytes_ok && byte_piece_[b] >= 0;
    if (!bytes_ok) {
        if (out.empty() || out.back() != unk_) out.push_back(unk_);  // a run of unknowns is one <unk>
        return;
    }
    for (unsigned char b : symbol) out.push_back(byte_piece_[b]);
}

std::vector<int64_t> SentencePieceTokenizer::encodeBpe(const std::vector<std::string>& symbols_in) const {
    struct Symbol {
        std::string text;
        bool fixed;  // user-defined pieces never merge
    };
    std::vector<Symbol> s;
    for (const auto& x : symbols_in) s.push_back({x, std::find(user_defined_.begin(), user_defined_.end(), x) != user_defined_.end()});
    while (s.size() > 1) {
        size_t best = s.size();
        float best_score = -std::numeric_limits<float>::infinity();
        for (size_t i = 0; i + 1 < s.size(); ++i) {
            if (s[i].fixed || s[i + 1].fixed) continue;
            auto it = index_.find(s[i].text + s[i + 1].text);
            if (it == index_.end()) continue;
            const Piece& p = pieces_[it->second];
            if (p.type != PieceType::Normal && p.type != PieceType::UserDefined) continue;
            if (p.score > best_score) best_score = p.score, best = i;  // ties: the leftmost pair
        }
        if (best == s.size()) break;
        s[best].text += s[best + 1].text;
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    std::vector<int64_t> out;
    for (const auto& x : s) appendSymbol(x.text, out);
    return out;
}

std::vector<int64_t> SentencePieceTokenizer::encodeUnigram(const std::string& text) const {
    // Viterbi over character boundaries; an unknown character costs 10 below the lowest score.
    float min_score = 0;
    for (const auto& p : pieces_) min_score = std::min(min_score, p.score);
    const float unk_score = min_score - 10.f;
    const size_t n = text.size();
    std::vector<float> best(n + 1, -std::numeric_limits<float>::infinity());
    std::vector<size_t> from(n + 1, 0);
    std::vector<int64_t> piece(n + 1, -1);
    best[0] = 0;
    for (size_t i = 0; i < n; i += utf8Length(static_cast<unsigned char>(text[i]))) {
        if (best[i] == -std::numeric_limits<float>::infinity()) continue;
        const size_t char_end = std::min(n, i + utf8Length(static_cast<unsigned char>(text[i])));
        if (best[i] + unk_score > best[char_end]) best[char_end] = best[i] + unk_score, from[char_end] = i, piece[char_end] = -1;
        for (size_t len = 1; len <= max_piece_bytes_ && i + len <= n; ++len) {
            auto it = index_.find(text.substr(i, len));
            if (it == index_.end()) continue;
            const Piece& p = pieces_[it->second];
            if (p.type != PieceType::Normal && p.type != PieceType::UserDefined) continue;
            const float score = p.type == PieceType::UserDefined ? 0.f : p.score;
            if (best[i] + score > best[i + len]) best[i + len] = best[i] + score, from[i + len] = i, piece[i + len] = it->second;
        }
    }
    std::vector<std::pair<size_t, int64_t>> path;  // (start, piece or -1 for an unknown character)
    for (size_t e = n; e > 0; e = from[e]) path.emplace_back(from[e], piece[e]);
    std::vector<int64_t> out;
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
        const size_t end = it + 1 == path.rend() ? n : (it + 1)->first;
        if (it->second >= 0) out.push_back(it->second);
        else appendSymbol(text.substr(it->first, end - it->first), out);
    }
    return out;
}

void SentencePieceTokenizer::readCharsmap(std::string_view blob, const std::string& where) {
    // [trie size, u32 LE][trie: u32 LE units][replacements, NUL-terminated]
    if (blob.empty()) return;
    check(blob.size() >= 4, where + ": precompiled character map shorter than its header");
    uint32_t trie_bytes = 0;
    for (int i = 0; i < 4; ++i) trie_bytes |= uint32_t(static_cast<unsigned char>(blob[i])) << (8 * i);
    check(trie_bytes % 4 == 0 && trie_bytes >= 4 && trie_bytes <= blob.size() - 4, where + ": precompiled character map has a bad trie size");
    charsmap_trie_.assign(trie_bytes / 4, 0);
    for (size_t u = 0; u < charsmap_trie_.size(); ++u)
        for (int i = 0; i < 4; ++i) charsmap_trie_[u] |= uint32_t(static_cast<unsigned char>(blob[4 + 4 * u + i])) << (8 * i);
    charsmap_replacements_ = std::string(blob.substr(4 + trie_bytes));
}

std::pair<std::string_view, size_t> SentencePieceTokenizer::normalizePrefix(std::string_view text) const {
    // Darts-clone's common prefix search, keeping the longest match. A unit holds
    // label = unit & (1 << 31 | 0xff), has_leaf = bit 8, offset = (unit >> 10) << ((unit & 1 << 9) >> 6),
    // and a leaf's value = unit & 0x7fffffff; out-of-range positions end the search.
    size_t longest = 0, value = 0;
    const auto& a = charsmap_trie_;
    if (!a.empty()) {
        const auto offset = [](uint32_t unit) { return size_t(unit >> 10) << ((unit & (1u << 9)) >> 6); };
        size_t node = offset(a[0]);
        for (size_t i = 0; i < text.size(); ++i) {
            const unsigned char c = static_cast<unsigned char>(text[i]);
            node ^= c;
            if (node >= a.size() || (a[node] & (1u << 31 | 0xff)) != c) break;
            const bool leaf = (a[node] >> 8) & 1;
            node ^= offset(a[node]);
            if (node >= a.size()) break;
            if (leaf) longest = i + 1, value = a[node] & 0x7fffffffu;
        }
    }
    if (longest > 0 && value < charsmap_replacements_.size()) return {std::string_view(charsmap_replacements_.c_str() + value), longest};
    const size_t len = validUtf8Length(text);
    if (len == 0) return {"\xEF\xBF\xBD", 1};  // malformed: U+FFFD for one byte
    return {text.substr(0, len), len};
}

// As sentencepiece's Normalizer::Normalize: character map first, then whitespace on the
// mapped text (maps may turn tabs or ideographic spaces into spaces).
std::string SentencePieceTokenizer::normalize(const std::string& text_in) const {
    std::string_view text = text_in;
    std::string out;
    if (remove_extra_whitespace_)
        while (!text.empty()) {  // leading spaces
            const auto [piece, used] = normalizePrefix(text);
            if (piece != " ") break;
            text.remove_prefix(used);
        }
    if (text.empty()) return out;
    const std::string space = escape_whitespace_ ? kSpace : " ";
    if (add_dummy_prefix_) out += space;
    bool prev_space = remove_extra_whitespace_;
    while (!text.empty()) {
        auto [piece, used] = normalizePrefix(text);
        while (prev_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
        if (!piece.empty()) {
            for (char c : piece)
                if (c == ' ') out += space;
                else out += c;
            prev_space = piece.back() == ' ';
        }
        text.remove_prefix(used);
        if (!remove_extra_whitespace_) prev_space = false;
    }
    if (remove_extra_whitespace_)
        while (out.size() >= space.size() && out.compare(out.size() - space.size(), space.size(), space) == 0) out.resize(out.size() - space.size());
    return out;
}

std::vector<int64_t> SentencePieceTokenizer::encode(const std::string& text_in) const {
    const std::string text = normalize(text_in);
    std::vector<int64_t> out;
    if (bos_ >= 0) out.push_back(bos_);
    if (text.empty()) return out;
    if (unigram_) {
        auto ids = encodeUnigram(text);
        out.insert(out.end(), ids.begin(), ids.end());
        return out;
    }
    std::vector<std::string> symbols;
    for (size_t i = 0; i < text.size();) {
        size_t len = 0;
        for (const auto& u : user_defined_)
            if (u.size() > len && text.compare(i, u.size(), u) == 0) len = u.size();
        if (len == 0) len = std::min(text.size() - i, utf8Length(static_cast<unsigned char>(text[i])));
        symbols.push_back(text.substr(i, len));
        i += len;
    }
    auto ids = encodeBpe(symbols);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
    std::string out;
    bool first = true;
    for (int64_t id : ids) {
        if (id < 0 || id >= vocabSize()) {  // a model may have more rows than its tokenizer has pieces
            out += "\xEF\xBF\xBD";
            first = false;
            continue;
        }
        const Piece& p = pieces_[id];
        if (p.type == PieceType::Control) continue;
        if (p.byte >= 0 && byte_piece_[p.byte] == id) {
            out += static_cast<char>(p.byte);
            first = false;
            continue;
        }
        std::string text = p.type == PieceType::Unknown ? " \xE2\x81\x87 " : p.text;  // sentencepiece shows <unk> as " ⁇ "
        for (size_t k; (k = text.find(kSpace)) != std::string::npos;) text.replace(k, kSpace.size(), " ");
        if (first && add_dummy_prefix_ && !text.empty() && text[0] == ' ') text.erase(0, 1);
        out += text;
        first = false;
    }
    return out;
}

}  // namespace kiln::llm
