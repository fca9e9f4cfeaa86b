# Passed to llama.cpp's own configure as CMAKE_PROJECT_llama.cpp_INCLUDE by the native step: llama.cpp
# stays the top-level project (its defaults unchanged), and the shim is added once the whole tree,
# llama-common included, has been defined (a deferred call at the end of the top-level directory).
if(CMAKE_VERSION VERSION_LESS 3.19)
  message(FATAL_ERROR "building llama-cpp-ext needs CMake 3.19 or newer (cmake_language(DEFER))")
endif()
# A deferred call may not add a subdirectory: the target is defined in the top-level directory. Its
# arguments are evaluated when it runs, hence the variable (set in the top-level scope).
set(LLAMA_CPP_EXT_CMAKE "${CMAKE_CURRENT_LIST_DIR}/llama-cpp-ext.cmake")
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL include "${LLAMA_CPP_EXT_CMAKE}")
