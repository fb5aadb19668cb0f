#include "backends/cuda/cuda_op.h"

#include <algorithm>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

Resources::Resources() {
    int device = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

cublasLtHandle_t Resources::lt() {
    if (!lt_) check(cublasLtCreate(&lt_) == CUBLAS_STATUS_SUCCESS, "cuBLASLt could not be initialized");
    return lt_;
}

cublasHandle_t Resources::blas() {
    if (!blas_) {
        check(cublasCreate(&blas_) == CUBLAS_STATUS_SUCCESS, "cuBLAS could not be initialized");
        check(cublasSetStream(blas_, stream_) == CUBLAS_STATUS_SUCCESS, "cublasSetStream failed");
        if (scratch_[0]) check(cublasSetWorkspace(blas_, scratch_[0], scratch_bytes_[0]) == CUBLAS_STATUS_SUCCESS, "cublasSetWorkspace failed");
    }
    return blas_;
}

cudnnHandle_t Resources::dnn() {
    if (!dnn_) {
        const cudnnStatus_t st = cudnnCreate(&dnn_);
        check(st == CUDNN_STATUS_SUCCESS, std::string("cuDNN could not be initialized: ") + cudnnGetErrorString(st));
        check(cudnnSetStream(dnn_, stream_) == CUDNN_STATUS_SUCCESS, "cudnnSetStream failed");
    }
    return dnn_;
}

Resources::~Resources() {
    if (stream_) cudaStreamSynchronize(stream_);
    for (void* p : scratch_) cudaFree(p);
    if (dnn_) cudnnDestroy(dnn_);
    if (blas_) cublasDestroy(blas_);
    if (lt_) cublasLtDestroy(lt_);
    if (stream_) cudaStreamDestroy(stream_);
}

void* Resources::scratch(int slot, size_t bytes) {
    if (bytes <= scratch_bytes_[slot]) return scratch_[slot];
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) throw Unsupported{"scratch memory would grow during graph capture"};
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // kernels in flight may still use the old buffer
    KILN_CUDA_CHECK(cudaFree(scratch_[slot]));
    scratch_[slot] = nullptr;
    const size_t rounded = std::max<size_t>(bytes + (bytes >> 2), 1 << 20);
    KILN_CUDA_CHECK(cudaMalloc(&scratch_[slot], rounded));
    scratch_bytes_[slot] = rounded;
    ++scratch_generation_;
    if (slot == 0 && blas_) check(cublasSetWorkspace(blas_, scratch_[0], rounded) == CUBLAS_STATUS_SUCCESS, "cublasSetWorkspace failed");
    return scratch_[slot];
}

const DeviceTensor& OpContext::input(size_t i) const {
    if (!has(i)) throw Error(node.describe() + ": input " + std::to_string(i) + " is missing");
    if (!inputs[i]->data && materialize) materialize(i);
    return *inputs[i];
}

DeviceTensor OpContext::output(size_t i, DType logical, const Dims& dims) {
    const DType physical = logical == DType::F32 ? storage : logical;
    DeviceTensor t = allocate(i, physical, dims);
    t.logical = logical;
    return t;
}

DeviceTensor OpContext::view(size_t i, size_t in, const Dims& dims) {
    const DeviceTensor& src = input(in);
    require(numElements(dims) == src.numel(), "view changes the element count");
    if (aliases.size() <= i) aliases.resize(i + 1, -1);
    aliases[i] = static_cast<int>(in);
    DeviceTensor t = src;
    t.dims = dims;
    if (src.host) t.host = std::make_shared<const Tensor>(src.host->reshaped(dims));
    return t;
}

void OpContext::require(bool ok, const std::string& message) const {
    if (!ok) throw Error(node.describe() + ": " + message);
}

std::vector<int64_t> OpContext::hostInts(size_t i) const {
    if (!has(i)) throw Error(node.describe() + ": input " + std::to_string(i) + " is missing");
    const DeviceTensor& t = *inputs[i];  // the host copy is enough: no upload
    if (!t.host) unsupported("input " + std::to_string(i) + " is computed on the device and read as shape data");
    return t.host->toInt64Vector();
}

DType OpContext::floatType(size_t i) const {
    const DType t = input(i).dtype;
    if (!isDeviceFloat(t)) unsupported("element type " + std::string(dtypeName(t)));
    return t;
}

void OpContext::readBack(void* host, const void* device, size_t bytes) {
    if (capturable) *capturable = false;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(stream(), &capturing));
    check(capturing == cudaStreamCaptureStatusNone, node.describe() + ": internal: data-dependent shape inside a CUDA graph");
    KILN_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream()));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

Shape6 toShape6(const Dims& dims, const OpContext& ctx) {
    if (dims.size() > static_cast<size_t>(kMaxRank)) ctx.unsupported("rank " + std::to_string(dims.size()) + " above " + std::to_string(kMaxRank));
    Shape6 s;
    s.rank = static_cast<int>(dims.size());
    for (size_t d = 0; d < dims.size(); ++d) s.dims[d] = dims[d];
    return s;
}

View6 denseView(const Dims& dims) {
    View6 v;
    v.dense = true;
    int64_t stride = 1;
    for (int d = static_cast<int>(dims.size()) - 1; d >= 0 && d < kMaxRank; --d) {
        v.strides[d] = stride;
        stride *= dims[d];
    }
    return v;
}

View6 broadcastView(const Dims& in, const Dims& out, const OpContext& ctx) {
    toShape6(out, ctx);
    if (in == out) return denseView(out);
    View6 v;
    const size_t lead = out.size() - in.size();
    int64_t stride = 1;
    for (int d = static_cast<int>(in.size()) - 1; d >= 0; --d) {
        v.strides[lead + d] = in[d] == 1 ? 0 : stride;
        stride *= in[d];
    }
    return v;
}

UnaryFn unaryFromName(const std::string& name, float a, float b, const OpContext& ctx) {
    static const std::map<std::string, UnaryOp> table = {
        {"none", UnaryOp::Identity}, {"", UnaryOp::Identity}, {"Identity", UnaryOp::Identity}, {"Relu", UnaryOp::Relu},
        {"Sigmoid", UnaryOp::Sigmoid}, {"Tanh", UnaryOp::Tanh}, {"LeakyRelu", UnaryOp::LeakyRelu}, {"Clip", UnaryOp::Clip},
        {"HardSigmoid", UnaryOp::HardSigmoid}, {"HardSwish", UnaryOp::HardSwish}, {"Gelu", UnaryOp::Gelu}, {"GeluTanh", UnaryOp::GeluTanh},
        {"Softplus", UnaryOp::Softplus}, {"Exp", UnaryOp::Exp}, {"Log", UnaryOp::Log}, {"Sqrt", UnaryOp::Sqrt}, {"Neg", UnaryOp::Neg},
        {"Abs", UnaryOp::Abs}, {"Erf", UnaryOp::Erf}, {"Reciprocal", UnaryOp::Reciprocal}, {"Floor", UnaryOp::Floor}, {"Ceil", UnaryOp::Ceil},
        {"Sin", UnaryOp::Sin}, {"Cos", UnaryOp::Cos}, {"Elu", UnaryOp::Elu}, {"Selu", UnaryOp::Selu}, {"Softsign", UnaryOp::Softsign},
        {"Sign", UnaryOp::Sign}, {"Round", UnaryOp::Round}, {"Silu", UnaryOp::Silu},
    };
    auto it = table.find(name);
    if (it == table.end()) ctx.unsupported("activation '" + name + "'");
    return UnaryFn{it->second, a, b};
}

UnaryFn fusedActivation(const OpContext& ctx) {
    auto params = ctx.attrs().getFloats("activation_params");
    params.resize(2, 0.0f);
    return unaryFromName(ctx.attrs().getString("activation", "none"), params[0], params[1], ctx);
}

float timeOnStream(cudaStream_t stream, const std::function<void()>& f) {
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    f();  // warm-up
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) {
        KILN_CUDA_CHECK(cudaEventRecord(start, stream));
        f();
        KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
        KILN_CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

const std::map<std::string, OpFn>& cudaOps() {
    static const std::map<std::string, OpFn> ops = [] {
        std::map<std::string, OpFn> m;
        addElementwiseOps(m);
        addShapeOps(m);
        addNnOps(m);
        addGemmOps(m);
        addConvOps(m);
        addReduceResizeOps(m);
        addIndexOps(m);
        addSelectionOps(m);
        addControlFlowOps(m);
        addRecurrentOps(m);
        return m;
    }();
    return ops;
}

}  // namespace kiln::cuda
