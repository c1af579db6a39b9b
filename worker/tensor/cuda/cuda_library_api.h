#ifndef DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARY_API_H_
#define DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARY_API_H_

// The functions of cuBLAS, cuDNN and NCCL that the backend calls, as tables
// of pointers filled by LoadCudaLibraries (cuda_libraries.h). For the
// backend's own files: a call is written `Cublas().cublasSgemm_64(...)`,
// `Cudnn().cudnnCreate(...)`, `Nccl().ncclAllReduce(...)` — the headers'
// own names and types, so the compiler checks every argument, and cuBLAS's
// macros (cublasSgemm_64 -> cublasSgemm_v2_64) rename the member as they
// rename the function.
//
// A function the backend starts to call must be added to its list below;
// the build fails otherwise (the table has no such member), and
// LoadCudaLibraries then checks at start-up that the loaded library has it.
//
// Thread-safety: the tables are immutable once loaded.

#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

namespace distrain::cuda {

#define DISTRAIN_CUBLAS_FUNCTIONS(X)                                                        \
  X(cublasCreate_v2) X(cublasGemmEx_64) X(cublasGetProperty) X(cublasGetStatusName)        \
  X(cublasSetMathMode) X(cublasSetPointerMode_v2) X(cublasSetStream_v2) X(cublasSgemm_v2_64)  \
  X(cublasSscal_v2_64)

#define DISTRAIN_CUDNN_FUNCTIONS(X)                                                         \
  X(cudnnBatchNormalizationBackward) X(cudnnBatchNormalizationForwardTraining)              \
  X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)                        \
  X(cudnnConvolutionForward) X(cudnnCreate)                                                 \
  X(cudnnCreateConvolutionDescriptor) X(cudnnCreateFilterDescriptor)                        \
  X(cudnnCreatePoolingDescriptor) X(cudnnCreateTensorDescriptor)                            \
  X(cudnnDeriveBNTensorDescriptor) X(cudnnDestroyConvolutionDescriptor)                     \
  X(cudnnDestroyFilterDescriptor) X(cudnnDestroyPoolingDescriptor)                          \
  X(cudnnDestroyTensorDescriptor) X(cudnnGetConvolution2dForwardOutputDim)                  \
  X(cudnnGetConvolutionBackwardDataAlgorithmMaxCount)                                       \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                            \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)                                           \
  X(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount)                                     \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                          \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                                         \
  X(cudnnGetConvolutionForwardAlgorithmMaxCount) X(cudnnGetConvolutionForwardAlgorithm_v7)  \
  X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnGetErrorString)                         \
  X(cudnnGetPooling2dForwardOutputDim) X(cudnnGetVersion) X(cudnnPoolingBackward)           \
  X(cudnnPoolingForward) X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType)  \
  X(cudnnSetFilter4dDescriptor) X(cudnnSetPooling2dDescriptor) X(cudnnSetStream)            \
  X(cudnnSetTensor4dDescriptor) X(cudnnSoftmaxBackward) X(cudnnSoftmaxForward)

#define DISTRAIN_NCCL_FUNCTIONS(X)                                                          \
  X(ncclAllGather) X(ncclAllReduce) X(ncclBroadcast) X(ncclCommAbort) X(ncclCommDestroy)    \
  X(ncclCommGetAsyncError) X(ncclCommInitAll) X(ncclCommInitRank) X(ncclGetErrorString)     \
  X(ncclGetUniqueId) X(ncclGetVersion) X(ncclGroupEnd) X(ncclGroupStart)

#define DISTRAIN_CUDA_LIBRARY_MEMBER(function) decltype(&::function) function = nullptr;
struct CublasApi {
  DISTRAIN_CUBLAS_FUNCTIONS(DISTRAIN_CUDA_LIBRARY_MEMBER)
};
struct CudnnApi {
  DISTRAIN_CUDNN_FUNCTIONS(DISTRAIN_CUDA_LIBRARY_MEMBER)
};
struct NcclApi {
  DISTRAIN_NCCL_FUNCTIONS(DISTRAIN_CUDA_LIBRARY_MEMBER)
};
#undef DISTRAIN_CUDA_LIBRARY_MEMBER

// The loaded tables. CHECK-fail with LoadCudaLibraries' error when the
// libraries did not load: distrain-worker checks them before it places
// anything on a GPU, and the tests skip without a GPU, so reaching one of
// these unloaded is a bug, not an environment problem.
const CublasApi& Cublas();
const CudnnApi& Cudnn();
const NcclApi& Nccl();

}  // namespace distrain::cuda

#endif  // DISTRAIN_WORKER_TENSOR_CUDA_CUDA_LIBRARY_API_H_
