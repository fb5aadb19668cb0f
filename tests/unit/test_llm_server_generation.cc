// Generation control of the OpenAI server (OpenAI server issue, item 2): stop strings, n,
// logprobs, presence/frequency penalties, stream_options.include_usage and
// max_completion_tokens, against a tiny model with a byte-level tokenizer.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "llm/stop_strings.h"
#include "llm_server_process.h"
#include "llm_test_models.h"

using namespace kiln::llm;
using namespace kiln::llm::testing;
using kiln::testing::ServerProcess;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Text is released only once no stop string can begin in it; the first stop string ends it.
TEST(StopStrings, MatchAcrossPiecesAndAreNeverHandedOut) {
    StopStringMatcher m({"END", "xy"});
    std::string out = m.add("abcE");  // "E" may begin "END": held back
    EXPECT_EQ(out, "abc");
    out += m.add("N");
    EXPECT_EQ(out, "abc");
    out += m.add("Dtail");
    EXPECT_EQ(out, "abc");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.add("more"), "");
    StopStringMatcher held({"END"});
    EXPECT_EQ(held.add("abEN"), "ab");
    EXPECT_EQ(held.finish(), "EN");  // never completed: released at the end
    StopStringMatcher earliest({"cd", "b"});
    EXPECT_EQ(earliest.add("abcd"), "a");
    StopStringMatcher none;
    EXPECT_EQ(none.add("text"), "text");
    StopStringMatcher first({"ab"});
    EXPECT_EQ(first.add("ab"), "");
    EXPECT_TRUE(first.stopped());
}

class ServerGeneration : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        DecoderConfig c = tinyConfig(Family::Gpt2);
        dir_ = new fs::path(writeModel(c, randomWeights(c, 29, 0.6f), "serve_generation"));
        std::ofstream(*dir_ / "tokenizer.json") << tokenizerJson();
        server_ = new ServerProcess(*dir_, "--num-blocks 64 --block-size 4 --served-model-name tiny");
    }
    static void TearDownTestSuite() {
        delete server_;
        fs::remove_all(*dir_);
        delete dir_;
    }
    static json post(const std::string& path, const json& body, int want_status = 200) {
        httplib::Client cli("127.0.0.1", server_->port);
        cli.set_read_timeout(30, 0);
        auto r = cli.Post(path, body.dump(), "application/json");
        if (!r) {
            ADD_FAILURE() << "no response: " << httplib::to_string(r.error());
            return json();
        }
        EXPECT_EQ(r->status, want_status) << body.dump() << " -> " << r->body;
        if (body.value("stream", false) && r->status == 200) {
            json events = json::array();
            for (const auto& e : kiln::testing::sseEvents(r->body)) events.push_back(json::parse(e));
            EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
            return events;
        }
        return json::parse(r->body, nullptr, false);
    }
    static fs::path* dir_;
    static ServerProcess* server_;
};
fs::path* ServerGeneration::dir_ = nullptr;
ServerProcess* ServerGeneration::server_ = nullptr;

// A stop string taken from the middle of a greedy completion: the text ends just before its
// first occurrence, finish_reason is "stop", and no streamed event carries it.
TEST_F(ServerGeneration, StopStringsEndTheTextBeforeThemStreamedOrNot) {
    int tried = 0;
    for (int k = 0; k < 12; ++k) {
        const json prompt = {k % 24, (k * 7 + 3) % 24, 30};
        const json plain = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
        const std::string text = plain["choices"][0]["text"];
        // Two letters (whole characters) past the start.
        size_t at = std::string::npos;
        for (size_t i = 1; i + 1 < text.size() && at == std::string::npos; ++i)
            if (std::isalpha(static_cast<unsigned char>(text[i])) && std::isalpha(static_cast<unsigned char>(text[i + 1]))) at = i;
        if (at == std::string::npos) continue;
        ++tried;
        const std::string stop = text.substr(at, 2);
        const std::string want = text.substr(0, text.find(stop));
        for (bool stream : {false, true}) {
            const json body = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"stop", {stop, "\xF0\x9F\x98\x80"}}, {"stream", stream}};
            const json r = post("/v1/completions", body);
            std::string got, finish;
            if (!stream) {
                got = r["choices"][0]["text"], finish = r["choices"][0]["finish_reason"];
                EXPECT_LE(r["usage"]["completion_tokens"].get<size_t>(), plain["usage"]["completion_tokens"].get<size_t>());
            } else {
                for (const auto& e : r) {
                    const json& c = e["choices"][0];
                    EXPECT_EQ(c["text"].get<std::string>().find(stop), std::string::npos) << e.dump();
                    got += c["text"].get<std::string>();
                    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
                }
            }
            EXPECT_EQ(got, want) << "stop '" << stop << "' in '" << text << "'" << (stream ? " (streamed)" : "");
            EXPECT_EQ(finish, "stop");
        }
    }
    EXPECT_GT(tried, 2) << "too few completions held two letters in a row: the test proves little";
    // Bad stops are 400s naming the field.
    for (const json& stop : {json::array({"a", "b", "c", "d", "e"}), json(""), json(3)})
        EXPECT_EQ(post("/v1/completions", {{"prompt", {1, 2}}, {"stop", stop}}, 400)["error"]["param"], "stop") << stop.dump();
}

// n choices: each its own sample (a seed makes them reproducible, choice by choice), indexed,
// with usage over all of them; streamed chunks carry their choice's index.
TEST_F(ServerGeneration, NChoicesAreSeparateSamplesReproducibleFromASeed) {
    const json body = {{"prompt", {3, 4, 5}}, {"max_tokens", 10}, {"temperature", 1.0}, {"n", 3}, {"seed", 11}};
    const json a = post("/v1/completions", body), b = post("/v1/completions", body);
    ASSERT_EQ(a["choices"].size(), 3u);
    std::set<std::vector<int64_t>> distinct;
    size_t tokens = 0;
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(a["choices"][i]["index"], i);
        EXPECT_EQ(a["choices"][i]["token_ids"], b["choices"][i]["token_ids"]) << "choice " << i << " is not reproducible from the seed";
        distinct.insert(a["choices"][i]["token_ids"].get<std::vector<int64_t>>());
        tokens += a["choices"][i]["token_ids"].size();
    }
    EXPECT_GT(distinct.size(), 1u) << "three samples at temperature 1 were identical";
    EXPECT_EQ(a["usage"]["completion_tokens"], tokens);
    EXPECT_EQ(a["usage"]["prompt_tokens"], 3);
    // Streamed, with include_usage: the choices' tokens add up to the non-streamed ones, and a
    // last chunk without choices holds the usage.
    json sbody = body;
    sbody["stream"] = true;
    sbody["stream_options"] = {{"include_usage", true}};
    const json events = post("/v1/completions", sbody);
    std::vector<std::vector<int64_t>> streamed(3);
    for (const auto& e : events)
        for (const auto& c : e["choices"]) {
            const auto more = c["token_ids"].get<std::vector<int64_t>>();
            streamed.at(c["index"].get<size_t>()).insert(streamed[c["index"].get<size_t>()].end(), more.begin(), more.end());
        }
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(streamed[i], a["choices"][i]["token_ids"].get<std::vector<int64_t>>()) << "choice " << i;
    ASSERT_FALSE(events.empty());
    EXPECT_TRUE(events.back()["choices"].empty());
    EXPECT_EQ(events.back()["usage"]["completion_tokens"], tokens);
    EXPECT_EQ(post("/v1/completions", {{"prompt", {1}}, {"stream_options", {{"include_usage", true}}}}, 400)["error"]["param"], "stream_options");
    EXPECT_EQ(post("/v1/completions", {{"prompt", {1}}, {"n", 0}}, 400)["error"]["param"], "n");
}

// logprobs: one entry per token, the greedy token the most likely of its alternatives, the
// alternatives in order and a probability distribution's; chat's format; streamed too.
TEST_F(ServerGeneration, LogprobsOfGreedyTokensAreTheBestOfTheirAlternatives) {
    const json r = post("/v1/completions", {{"prompt", {7, 8}}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}});
    const json& lp = r["choices"][0]["logprobs"];
    const auto ids = r["choices"][0]["token_ids"].get<std::vector<int64_t>>();
    ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
    ASSERT_EQ(lp["tokens"].size(), ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
        const double mine = lp["token_logprobs"][t];
        EXPECT_LE(mine, 0.0);
        ASSERT_EQ(lp["top_logprobs"][t].size(), 3u);
        double best = -INFINITY, mass = 0;
        for (const auto& [token, v] : lp["top_logprobs"][t].items()) best = std::max(best, v.get<double>()), mass += std::exp(v.get<double>());
        EXPECT_NEAR(mine, best, 1e-9) << "token " << t << " is greedy, so the most likely";
        EXPECT_LE(mass, 1.0 + 1e-9);
        EXPECT_GT(mass, std::exp(mine) - 1e-12);
    }
    const json chat = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "ab"}}}}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}});
    const json& content = chat["choices"][0]["logprobs"]["content"];
    ASSERT_FALSE(content.empty());
    for (const auto& entry : content) {
        ASSERT_EQ(entry["top_logprobs"].size(), 2u);
        EXPECT_NEAR(entry["logprob"].get<double>(), entry["top_logprobs"][0]["logprob"].get<double>(), 1e-9);
        EXPECT_GE(entry["top_logprobs"][0]["logprob"].get<double>(), entry["top_logprobs"][1]["logprob"].get<double>());
        EXPECT_TRUE(entry["bytes"].is_array());
    }
    const json events = post("/v1/completions", {{"prompt", {7, 8}}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}, {"stream", true}});
    std::vector<double> streamed;
    for (const auto& e : events)
        if (!e["choices"][0]["logprobs"].is_null())
            for (const auto& v : e["choices"][0]["logprobs"]["token_logprobs"]) streamed.push_back(v);
    EXPECT_EQ(streamed, lp["token_logprobs"].get<std::vector<double>>());
    EXPECT_EQ(post("/v1/completions", {{"prompt", {1}}, {"logprobs", 21}}, 400)["error"]["param"], "logprobs");
    EXPECT_EQ(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"top_logprobs", 2}}, 400)["error"]["param"], "top_logprobs");
}

// Presence and frequency penalties change what greedy decoding picks once tokens repeat;
// out of [-2, 2] they are 400s. max_completion_tokens bounds the completion like max_tokens,
// and without either the completion may run to the context.
TEST_F(ServerGeneration, PenaltiesAndTokenLimits) {
    const json base = {{"prompt", {9, 10, 11}}, {"max_tokens", 30}, {"temperature", 0}, {"ignore_eos", true}};
    const auto plain = post("/v1/completions", base)["choices"][0]["token_ids"].get<std::vector<int64_t>>();
    json penalized = base;
    penalized["frequency_penalty"] = 2.0, penalized["presence_penalty"] = 2.0;
    const auto other = post("/v1/completions", penalized)["choices"][0]["token_ids"].get<std::vector<int64_t>>();
    std::set<int64_t> plain_set(plain.begin(), plain.end()), other_set(other.begin(), other.end());
    EXPECT_NE(plain, other);
    EXPECT_GE(other_set.size(), plain_set.size()) << "penalized repetition should not use fewer distinct tokens";
    EXPECT_EQ(post("/v1/completions", {{"prompt", {1}}, {"presence_penalty", 2.5}}, 400)["error"]["param"], "presence_penalty");
    const json limited = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "ab"}}}}, {"max_completion_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}});
    EXPECT_EQ(limited["usage"]["completion_tokens"], 3);
    EXPECT_EQ(limited["choices"][0]["finish_reason"], "length");
    const json open = post("/v1/completions", {{"prompt", {1, 2, 3, 4}}, {"temperature", 0}, {"ignore_eos", true}});
    EXPECT_EQ(open["usage"]["completion_tokens"], 64 - 4) << "without max_tokens the completion runs to the context";
}

}  // namespace
