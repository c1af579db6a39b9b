# CUDA / cuBLAS / cuDNN / NCCL detection for DISTRAIN_CUDA=AUTO|ON|OFF.
#
# Search order: CUDA_TOOLKIT_ROOT / /usr/local/cuda (a system toolkit), then the
# CUDA 13 + cuBLAS + cuDNN + NCCL wheels that scripts/setup.sh installs from PyPI into
# ${DISTRAIN_DEPS_PREFIX}/cuda13 (laid out as bin/ include/ lib/ by setup.sh).
# Sets DISTRAIN_HAVE_CUDA, and the imported targets distrain::cudart,
# distrain::cublas, distrain::cudnn and distrain::nccl when all are found. Prints which toolkit it used.

set(DISTRAIN_HAVE_CUDA OFF)
if(DISTRAIN_CUDA STREQUAL "OFF")
  message(STATUS "distrain: CUDA disabled (DISTRAIN_CUDA=OFF)")
  return()
endif()

set(_distrain_cuda_candidates)
if(DEFINED ENV{CUDA_TOOLKIT_ROOT})
  list(APPEND _distrain_cuda_candidates "$ENV{CUDA_TOOLKIT_ROOT}")
endif()
list(APPEND _distrain_cuda_candidates /usr/local/cuda "${DISTRAIN_DEPS_PREFIX}/cuda13")

set(_distrain_cuda_root "")
foreach(_cand IN LISTS _distrain_cuda_candidates)
  if(EXISTS "${_cand}/bin/nvcc")
    set(_distrain_cuda_root "${_cand}")
    break()
  endif()
endforeach()

if(_distrain_cuda_root STREQUAL "")
  if(DISTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "distrain: DISTRAIN_CUDA=ON but no nvcc was found in: ${_distrain_cuda_candidates}. "
                        "Run scripts/setup.sh (installs the CUDA 13 wheels) or set CUDA_TOOLKIT_ROOT.")
  endif()
  message(STATUS "distrain: no CUDA toolkit found (looked in ${_distrain_cuda_candidates}); building CPU only")
  return()
endif()

# NCCL: next to the toolkit (system installs put it in /usr/include + /usr/lib), or the wheel.
find_path(DISTRAIN_NCCL_INCLUDE nccl.h
          HINTS "${_distrain_cuda_root}/include" "${DISTRAIN_DEPS_PREFIX}/cuda13/include" /usr/include
          NO_DEFAULT_PATH)
find_library(DISTRAIN_NCCL_LIBRARY NAMES nccl libnccl.so.2
             HINTS "${_distrain_cuda_root}/lib64" "${_distrain_cuda_root}/lib" /usr/lib/x86_64-linux-gnu
             NO_DEFAULT_PATH)
if(NOT DISTRAIN_NCCL_INCLUDE OR NOT DISTRAIN_NCCL_LIBRARY)
  if(DISTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "distrain: CUDA found at ${_distrain_cuda_root} but NCCL was not (nccl.h / libnccl). "
                        "Run scripts/setup.sh to install the nvidia-nccl-cu13 wheel.")
  endif()
  message(STATUS "distrain: CUDA at ${_distrain_cuda_root} but no NCCL; building CPU only")
  return()
endif()

# cuBLAS (GEMM) and cuDNN (convolution, pooling, batch norm, softmax): the
# CUDA backend needs both, found like NCCL.
find_library(DISTRAIN_CUBLAS_LIBRARY NAMES cublas libcublas.so.13
             HINTS "${_distrain_cuda_root}/lib64" "${_distrain_cuda_root}/lib" NO_DEFAULT_PATH)
find_path(DISTRAIN_CUDNN_INCLUDE cudnn.h
          HINTS "${_distrain_cuda_root}/include" "${DISTRAIN_DEPS_PREFIX}/cuda13/include" /usr/include
          NO_DEFAULT_PATH)
find_library(DISTRAIN_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
             HINTS "${_distrain_cuda_root}/lib64" "${_distrain_cuda_root}/lib" /usr/lib/x86_64-linux-gnu
             NO_DEFAULT_PATH)
if(NOT DISTRAIN_CUBLAS_LIBRARY OR NOT DISTRAIN_CUDNN_INCLUDE OR NOT DISTRAIN_CUDNN_LIBRARY)
  if(DISTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "distrain: CUDA found at ${_distrain_cuda_root} but cuBLAS or cuDNN was not "
                        "(libcublas, cudnn.h / libcudnn). Run scripts/setup.sh to install the "
                        "nvidia-cublas and nvidia-cudnn-cu13 wheels.")
  endif()
  message(STATUS "distrain: CUDA at ${_distrain_cuda_root} but no cuBLAS/cuDNN; building CPU only")
  return()
endif()

set(CMAKE_CUDA_COMPILER "${_distrain_cuda_root}/bin/nvcc")
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # Hopper (H100/H200) and Ampere; override with -DCMAKE_CUDA_ARCHITECTURES=...
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
enable_language(CUDA)
# CMake 3.25 predates nvcc's C++20 support in its tables; the backend's
# headers are the project's C++20 (ops.h, model_spec.h), so teach it the flag.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
# Not find_package(CUDAToolkit): CMake 3.25's module expects libraries CUDA 13
# no longer ships (nvToolsExt) and fails; cudart is all the build links.
# The runtime is linked statically: it finds the driver (libcuda, mounted
# from the node) itself, so a CUDA build starts on any host.
find_library(DISTRAIN_CUDART_STATIC_LIBRARY NAMES cudart_static libcudart_static.a
             HINTS "${_distrain_cuda_root}/lib64" "${_distrain_cuda_root}/lib" NO_DEFAULT_PATH REQUIRED)
find_package(Threads REQUIRED)
add_library(distrain::cudart STATIC IMPORTED)
set_target_properties(distrain::cudart PROPERTIES
  IMPORTED_LOCATION "${DISTRAIN_CUDART_STATIC_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${_distrain_cuda_root}/include"
  INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS};rt")

# cuBLAS, cuDNN and NCCL are opened at run time (worker/tensor/cuda/cuda_libraries.h),
# never linked: the worker's CPU image does not carry them. These targets
# give their headers, and the files found here as the loader's last resort
# (so build trees run without LD_LIBRARY_PATH).
add_library(distrain::cuda_libraries INTERFACE IMPORTED)
set_target_properties(distrain::cuda_libraries PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_distrain_cuda_root}/include;${DISTRAIN_NCCL_INCLUDE};${DISTRAIN_CUDNN_INCLUDE}"
  INTERFACE_COMPILE_DEFINITIONS
    "DISTRAIN_CUBLAS_FILE=\"${DISTRAIN_CUBLAS_LIBRARY}\";DISTRAIN_CUDNN_FILE=\"${DISTRAIN_CUDNN_LIBRARY}\";DISTRAIN_NCCL_FILE=\"${DISTRAIN_NCCL_LIBRARY}\"")

set(DISTRAIN_HAVE_CUDA ON)
set(DISTRAIN_CUDA_ROOT "${_distrain_cuda_root}")
message(STATUS "distrain: CUDA ${CMAKE_CUDA_COMPILER_VERSION} at ${_distrain_cuda_root}; NCCL ${DISTRAIN_NCCL_LIBRARY}")
