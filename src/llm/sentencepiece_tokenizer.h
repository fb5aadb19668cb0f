// SentencePiece tokenizers (Llama / Mistral style tokenizer.model) without the
// sentencepiece library: the model file is a protobuf message whose few fields we need are
// read straight from the wire format (Debian's libsentencepiece cannot share a process with
// the protobuf ONNX links). BPE models merge the best-scoring adjacent pair first; unigram
// models take the best-scoring segmentation (Viterbi). Unknown characters fall back to
// <0xXX> byte pieces when the model has them. Normalization as sentencepiece's Normalizer:
// the model's precompiled character map (NFKC for nmt_nfkc models; a double-array trie whose
// longest match at each position is replaced), extra whitespace removed, the dummy prefix, and
// whitespace escaped as U+2581.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "llm/tokenizer.h"

namespace kiln::llm {

class SentencePieceTokenizer : public Tokenizer {
public:
    enum class PieceType { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };
    struct Piece {
        std::string text;
        float score = 0;
        PieceType type = PieceType::Normal;
        int byte = -1;  // for a <0xXX> byte piece, the byte it stands for
    };

    static SentencePieceTokenizer load(const std::filesystem::path& model_file);
    // `bytes` is the serialized ModelProto; `where` names it in errors.
    static SentencePieceTokenizer parse(const std::string& bytes, const std::string& where);

    // Starts with the BOS piece (<s>) when the model has one, as Hugging Face's Llama tokenizer does.
    std::vector<int64_t> encode(const std::string& text) const override;
    std::string decode(const std::vector<int64_t>& ids) const override;
    int64_t vocabSize() const override { return static_cast<int64_t>(pieces_.size()); }
    bool isSpecial(int64_t id) const override { return id >= 0 && id < vocabSize() && pieces_[static_cast<size_t>(id)].type == PieceType::Control; }
    const std::vector<Piece>& pieces() const { return pieces_; }

private:
    std::vector<int64_t> encodeBpe(const std::vector<std::string>& symbols) const;
    std::vector<int64_t> encodeUnigram(const std::string& text) const;
    // The model's normalized form of text, ready to split into pieces.
    std::string normalize(const std::string& text) const;
    // The replacement of text's longest prefix the character map has (or of its first
    // character: itself, U+FFFD when malformed), and the bytes it consumes.
    std::pair<std::string_view, size_t> normalizePrefix(std::string_view text) const;
    void readCharsmap(std::string_view blob, const std::string& where);
    void appendSymbol(const std::string& symbol, std::vector<int64_t>& out) const;

    std::vector<Piece> pieces_;
    std::unordered_map<std::string, int64_t> index_;
    std::vector<std::string> user_defined_;  // matched verbatim before splitting
    bool unigram_ = false, byte_fallback_ = false, add_dummy_prefix_ = true, escape_whitespace_ = true, remove_extra_whitespace_ = true;
    int64_t unk_ = 0, bos_ = -1, byte_piece_[256];
    size_t max_piece_bytes_ = 1;
    // The precompiled character map: a Darts-clone double array and the replacements
    // (NUL-terminated) its leaves point into. Empty: identity.
    std::vector<uint32_t> charsmap_trie_;
    std::string charsmap_replacements_;
};

}  // namespace kiln::llm
