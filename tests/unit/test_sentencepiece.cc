// SentencePiece tokenizers read from model files written here byte by byte in the protobuf
// wire format, with expected segmentations worked out by hand from the merge scores.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/error.h"
#include "llm/sentencepiece_tokenizer.h"
#include "llm/tokenizer.h"

using namespace kiln;
using namespace kiln::llm;

namespace {

std::string varint(uint64_t v) {
    std::string s;
    do {
        s += static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return s;
}
std::string field(uint32_t number, const std::string& bytes) { return varint(number << 3 | 2) + varint(bytes.size()) + bytes; }
std::string flag(uint32_t number, uint64_t v) { return varint(number << 3) + varint(v); }

std::string piece(const std::string& text, float score, int type = 1) {
    uint32_t bits;
    std::memcpy(&bits, &score, 4);
    std::string f32 = varint(2 << 3 | 5);
    for (int i = 0; i < 4; ++i) f32 += static_cast<char>((bits >> (8 * i)) & 0xff);
    return field(1, field(1, text) + f32 + flag(3, static_cast<uint64_t>(type)));
}

const std::string kSp = "\xE2\x96\x81";

// <unk>, <s>, </s>, 256 byte pieces, then the given normal pieces.
std::string model(int model_type, const std::vector<std::pair<std::string, float>>& normal, bool byte_fallback = true) {
    std::string m = piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3);
    for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        m += piece(hex, 0, 6);
    }
    for (const auto& [t, s] : normal) m += piece(t, s);
    m += field(2, flag(3, static_cast<uint64_t>(model_type)) + flag(35, byte_fallback ? 1 : 0));
    m += field(3, flag(3, 1) + flag(4, 0) + flag(5, 1));  // dummy prefix on, extra whitespace kept, spaces escaped
    return m;
}

int64_t id(const SentencePieceTokenizer& t, const std::string& text) {
    for (size_t i = 0; i < t.pieces().size(); ++i)
        if (t.pieces()[i].text == text) return static_cast<int64_t>(i);
    ADD_FAILURE() << "no piece " << text;
    return -1;
}

TEST(SentencePiece, BpeMergesTheBestScoringPairFirstAndFallsBackToBytes) {
    const std::vector<std::pair<std::string, float>> vocab = {
        {kSp, -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
        {"ll", -0.5f}, {kSp + "h", -1.0f}, {"llo", -1.2f}, {kSp + "he", -1.5f}, {kSp + "hello", -2.0f},
        {kSp + "w", -1.1f}, {"or", -1.3f}, {"ld", -1.4f}, {kSp + "wor", -1.6f}, {kSp + "world", -2.5f}};
    const auto t = SentencePieceTokenizer::parse(model(2, vocab), "test.model");
    // ▁hello: ll, ▁h, llo, ▁he, ▁hello; ▁world: ▁w, or, ld, ▁wor, ▁world.
    EXPECT_EQ(t.encode("hello world"), (std::vector<int64_t>{1, id(t, kSp + "hello"), id(t, kSp + "world")}));
    // é is no piece: its two UTF-8 bytes become <0xC3> <0xA9>.
    EXPECT_EQ(t.encode("hé"), (std::vector<int64_t>{1, id(t, kSp + "h"), 3 + 0xC3, 3 + 0xA9}));
    EXPECT_EQ(t.decode(t.encode("hé")), "hé");
    EXPECT_EQ(t.decode(t.encode("hello world")), "hello world");
    EXPECT_EQ(t.decode({id(t, kSp + "he"), id(t, "llo"), 2}), "hello");  // </s> is a control piece: not shown
    EXPECT_EQ(t.encode(""), (std::vector<int64_t>{1}));
    // Without byte pieces to fall back on, a run of unknown characters is one <unk>.
    const auto nb = SentencePieceTokenizer::parse(model(2, vocab, false), "test.model");
    EXPECT_EQ(nb.encode("hé"), (std::vector<int64_t>{1, id(nb, kSp + "h"), 0}));
}

TEST(SentencePiece, UnigramTakesTheBestScoringSegmentation) {
    const std::vector<std::pair<std::string, float>> vocab = {
        {kSp, -3}, {"h", -3}, {"e", -3}, {"l", -3}, {"o", -3}, {kSp + "he", -1}, {"llo", -1}, {kSp + "hello", -1.5f}, {kSp + "hel", -0.2f}, {"lo", -0.3f}};
    const auto t = SentencePieceTokenizer::parse(model(1, vocab), "test.model");
    // ▁hel + lo (-0.5) beats ▁hello (-1.5) and ▁he + llo (-2).
    EXPECT_EQ(t.encode("hello"), (std::vector<int64_t>{1, id(t, kSp + "hel"), id(t, "lo")}));
    EXPECT_EQ(t.decode(t.encode("hello")), "hello");
    // An uncovered character falls back to bytes inside the best path.
    EXPECT_EQ(t.encode("hé"), (std::vector<int64_t>{1, id(t, kSp), id(t, "h"), 3 + 0xC3, 3 + 0xA9}));
}

TEST(SentencePiece, FoldersAndCorruptFiles) {
    const auto dir = std::filesystem::temp_directory_path() / ("kiln-sp-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "tokenizer.model", std::ios::binary) << model(2, {{kSp, -1}, {"a", -2}});
    auto t = loadTokenizer(dir);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->vocabSize(), 3 + 256 + 2);
    EXPECT_EQ(t->decode(t->encode("a a")), "a a");
    const std::string good = model(2, {{kSp, -1}});
    for (const std::string& bad : {good.substr(0, good.size() - 3), std::string("\x0a\x05\x0a\x01", 4), std::string()}) {
        std::ofstream(dir / "tokenizer.model", std::ios::binary | std::ios::trunc) << bad;
        EXPECT_THROW(loadTokenizer(dir), Error);
    }
    std::ofstream(dir / "tokenizer.model", std::ios::binary | std::ios::trunc) << model(3, {{kSp, -1}});  // WORD model
    try {
        loadTokenizer(dir);
        FAIL() << "a word model was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

}  // namespace

// A model trained by Debian's spm_train with its default NFKC normalization
// (scripts/make_sentencepiece_nfkc_test.sh): the character map folds full-width letters,
// ligatures, circled digits, squared words and tabs or ideographic spaces, whitespace runs
// collapse after it, and a malformed byte becomes U+FFFD; every case must give the ids
// spm_encode gave (after our leading <s>).
TEST(SentencePiece, NfkcModelMatchesSpmEncode) {
    const std::filesystem::path dir = std::filesystem::path(KILN_SOURCE_DIR) / "tests" / "data" / "sentencepiece_nfkc";
    const auto t = SentencePieceTokenizer::load(dir / "tokenizer.model");
    std::ifstream cases(dir / "cases.txt");
    std::string hex, ids_line;
    int checked = 0;
    while (std::getline(cases, hex) && std::getline(cases, ids_line)) {
        std::string text;
        for (size_t i = 0; i + 1 < hex.size(); i += 2) text += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
        std::vector<int64_t> want = {1};  // <s>
        std::istringstream ids(ids_line);
        for (int64_t id; ids >> id;) want.push_back(id);
        EXPECT_EQ(t.encode(text), want) << "input hex " << hex;
        ++checked;
    }
    EXPECT_EQ(checked, 10);
}
