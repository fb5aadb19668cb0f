// calib.json: a model's calibration ranges, keyed by the model file's hash.
#include <fstream>

#include <nlohmann/json.hpp>

#include "ir/file_write.h"
#include "quant/qdq_insertion.h"

namespace kiln {

CalibrationTable readCalibration(const std::string& path) {
    std::ifstream in(path);
    check(in.good(), "--calib: cannot read " + path);
    nlohmann::json j;
    try {
        in >> j;
        CalibrationTable t{j.at("model_hash").get<std::string>(), j.value("method", ""), j.value("samples", 0), {}};
        for (const auto& [name, r] : j.at("ranges").items()) t.ranges[name] = TensorRange{r.at(0).get<double>(), r.at(1).get<double>()};
        return t;
    } catch (const nlohmann::json::exception& e) {
        throw Error("--calib " + path + ": not a Kiln calibration file (" + e.what() + ")");
    }
}

void writeCalibration(const CalibrationTable& t, const std::string& path) {
    nlohmann::json j = {{"model_hash", t.model_hash}, {"method", t.method}, {"samples", t.samples}, {"ranges", nlohmann::json::object()}};
    for (const auto& [name, r] : t.ranges) j["ranges"][name] = {r.min, r.max};
    writeFileAtomically(path, j.dump(1) + "\n");
}

}  // namespace kiln
