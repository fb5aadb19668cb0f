// Stop strings (OpenAI's `stop`), matched on the generated text across token boundaries.
// Text is handed out only once no stop string can begin in it; at the first match the text
// ends before the stop string, which is never handed out.
#pragma once
#include <string>
#include <vector>

namespace kiln::llm {

class StopStringMatcher {
public:
    explicit StopStringMatcher(std::vector<std::string> stops = {});
    // Adds generated text; returns what can be handed out now ("" once stopped).
    std::string add(const std::string& text);
    // The text held back at the end of generation (a stop string's beginning that never
    // completed); "" once stopped.
    std::string finish();
    bool stopped() const { return stopped_; }

private:
    std::vector<std::string> stops_;
    std::string pending_;
    size_t longest_ = 0;
    bool stopped_ = false;
};

}  // namespace kiln::llm
