# Copy every real shared library in ${_bin} to ${_dest}, named by its SONAME (libfoo.so.X for a
# versioned libfoo.so.X.Y.Z; module libraries keep their name). Symlinks are skipped.
file(MAKE_DIRECTORY "${_dest}")
file(GLOB _candidates LIST_DIRECTORIES false "${_bin}/lib*.so*" "${_bin}/*.dylib" "${_bin}/*.dll")
foreach(_f IN LISTS _candidates)
  if(IS_SYMLINK "${_f}")
    continue()
  endif()
  get_filename_component(_name "${_f}" NAME)
  string(REGEX REPLACE "^(lib.+\\.so\\.[0-9]+)(\\.[0-9]+)+$" "\\1" _soname "${_name}")
  message(STATUS "Installing: ${_dest}/${_soname}")
  file(COPY_FILE "${_f}" "${_dest}/${_soname}" ONLY_IF_DIFFERENT)
  file(CHMOD "${_dest}/${_soname}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
