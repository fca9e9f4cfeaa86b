# The llama-cpp-ext target: llama-cpp-python's C API (JSON in, JSON out) over llama.cpp's common
# library, starting with the chat layer (common/chat.h). Included once llama.cpp's targets exist, in
# the directory that then owns the target: llama.cpp's top level in the native step (inject.cmake),
# this folder's CMakeLists.txt for `pip install .`.
if(NOT TARGET llama-common)
  message(FATAL_ERROR "llama-cpp-ext needs llama.cpp's llama-common target: configure with LLAMA_BUILD_COMMON=ON")
endif()

add_library(llama-cpp-ext SHARED "${CMAKE_CURRENT_LIST_DIR}/llama-cpp-ext.cpp" "${CMAKE_CURRENT_LIST_DIR}/llama-cpp-ext.h")
# fitting parameters to free memory (common/fit.h)
target_sources(llama-cpp-ext PRIVATE "${CMAKE_CURRENT_LIST_DIR}/llama-cpp-ext-fit.cpp" "${CMAKE_CURRENT_LIST_DIR}/llama-cpp-ext-fit.h")
target_compile_features(llama-cpp-ext PRIVATE cxx_std_17)
target_compile_definitions(llama-cpp-ext PRIVATE LLAMA_CPP_EXT_BUILD)
target_link_libraries(llama-cpp-ext PRIVATE llama-common llama)
# Only the C API is exported; beside llama.cpp's libraries (lib/), found through RUNPATH $ORIGIN.
set_target_properties(llama-cpp-ext PROPERTIES
  C_VISIBILITY_PRESET hidden
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  POSITION_INDEPENDENT_CODE ON
  LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin"
  RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin"
  ARCHIVE_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/lib")
