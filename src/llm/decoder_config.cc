#include "llm/decoder_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ir/error.h"

namespace kiln::llm {

namespace {

// eos_token_id as Hugging Face writes it: an id, a list of ids, or null.
std::vector<int64_t> eosIds(const nlohmann::json& j, const std::string& where) {
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return {};
    const nlohmann::json& v = j["eos_token_id"];
    auto id = [&](const nlohmann::json& x) {
        check(x.is_number_integer() && x.get<double>() >= 0 && x.get<double>() < 2147483648.0, where + ": 'eos_token_id' must be a token id or a list of them, got " + v.dump());
        return x.get<int64_t>();
    };
    if (!v.is_array()) return {id(v)};
    std::vector<int64_t> ids;
    for (const auto& x : v) ids.push_back(id(x));
    return ids;
}

DecoderConfig parseConfig(const nlohmann::json& j, const std::string& where) {
    check(j.is_object(), where + ": not a JSON object");
    // Sizes are positive and below 2^31 (products of them size the weights); scales and
    // epsilons are finite and positive (a zero rope_theta or a negative epsilon gives NaN).
    auto integer = [&](std::initializer_list<const char*> keys, int64_t fallback = -1) {
        for (const char* k : keys)
            if (j.contains(k) && !j[k].is_null()) {  // Hugging Face writes unset fields as null
                check(j[k].is_number_integer() && !j[k].is_number_float() && j[k].get<double>() > 0 && j[k].get<double>() < 2147483648.0,
                      where + ": '" + k + "' must be a positive integer below 2^31, got " + j[k].dump());
                return j[k].get<int64_t>();
            }
        check(fallback >= 0, where + ": missing '" + std::string(*keys.begin()) + "'");
        return fallback;
    };
    auto positive = [&](const nlohmann::json& v, const std::string& name) {
        check(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0 && v.get<double>() < 3.0e38,
              where + ": '" + name + "' must be a positive finite number, got " + v.dump());
        return v.get<float>();
    };
    auto number = [&](const char* k, double fallback) {
        if (!j.contains(k) || j[k].is_null()) return static_cast<float>(fallback);
        return positive(j[k], k);
    };
    auto text = [&](const nlohmann::json& o, const char* k, const std::string& fallback) {
        if (!o.contains(k) || o[k].is_null()) return fallback;
        check(o[k].is_string(), where + ": '" + std::string(k) + "' must be a string, got " + o[k].dump());
        return o[k].get<std::string>();
    };
    auto flag = [&](const char* k, bool fallback) {
        if (!j.contains(k) || j[k].is_null()) return fallback;
        check(j[k].is_boolean(), where + ": '" + std::string(k) + "' must be true or false, got " + j[k].dump());
        return j[k].get<bool>();
    };
    const std::string type = text(j, "model_type", "");
    DecoderConfig c;
    if (type == "gpt2") {
        c.family = Family::Gpt2;
        c.hidden = integer({"n_embd", "hidden_size"});
        c.layers = integer({"n_layer", "num_hidden_layers"});
        c.heads = integer({"n_head", "num_attention_heads"});
        c.kv_heads = c.heads;
        c.intermediate = integer({"n_inner"}, 4 * c.hidden);
        c.max_positions = integer({"n_positions", "max_position_embeddings"});
        c.norm_eps = number("layer_norm_epsilon", 1e-5);
        c.tie_embeddings = true;
    } else if (type == "llama" || type == "mistral" || type == "qwen2") {
        c.family = Family::Llama;
        c.hidden = integer({"hidden_size"});
        c.layers = integer({"num_hidden_layers"});
        c.heads = integer({"num_attention_heads"});
        c.kv_heads = integer({"num_key_value_heads"}, c.heads);
        c.intermediate = integer({"intermediate_size"});
        c.max_positions = integer({"max_position_embeddings"}, 2048);
        c.norm_eps = number("rms_norm_eps", 1e-6);
        c.rope_theta = number("rope_theta", 10000.0);
        if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("rope_theta")) {  // transformers 5
            const auto& rp = j["rope_parameters"];
            c.rope_theta = positive(rp["rope_theta"], "rope_parameters.rope_theta");
            const std::string rope_type = text(rp, "rope_type", "default");
            check(rope_type == "default", where + ": rope_type '" + rope_type + "' is not supported (default only)");
        }
        c.tie_embeddings = flag("tie_word_embeddings", false);
    } else {
        throw Error(where + ": model_type '" + type + "' is not supported (gpt2, llama, mistral, qwen2)");
    }
    c.vocab = integer({"vocab_size"});
    check(c.hidden % c.heads == 0, where + ": hidden size " + std::to_string(c.hidden) + " is not a multiple of the heads " + std::to_string(c.heads));
    check(c.heads % c.kv_heads == 0, where + ": attention heads are not a multiple of the key/value heads");
    c.head_dim = integer({"head_dim"}, c.hidden / c.heads);
    check(c.family == Family::Gpt2 || c.head_dim % 2 == 0, where + ": RoPE needs an even head size");
    c.eos_token_ids = eosIds(j, where);
    for (int64_t id : c.eos_token_ids) check(id < c.vocab, where + ": eos_token_id " + std::to_string(id) + " is outside the vocabulary");
    return c;
}

}  // namespace

DecoderConfig DecoderConfig::parse(const std::string& json_text, const std::string& where) {
    const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
    try {
        return parseConfig(j, where);
    } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type
        throw Error(where + ": " + e.what());
    }
}

DecoderConfig DecoderConfig::load(const std::filesystem::path& path) {
    std::ifstream in(path);
    check(in.good(), path.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    DecoderConfig c = parse(ss.str(), path.string());
    const std::filesystem::path gen = path.parent_path() / "generation_config.json";
    if (std::filesystem::is_regular_file(gen)) {  // what generate() uses in transformers: it wins
        std::ifstream g(gen);
        std::stringstream gs;
        gs << g.rdbuf();
        const nlohmann::json j = nlohmann::json::parse(gs.str(), nullptr, false);
        check(j.is_object(), gen.string() + ": not a JSON object");
        if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
            c.eos_token_ids = eosIds(j, gen.string());
            for (int64_t id : c.eos_token_ids) check(id < c.vocab, gen.string() + ": eos_token_id " + std::to_string(id) + " is outside the vocabulary");
        }
    }
    return c;
}

}  // namespace kiln::llm
