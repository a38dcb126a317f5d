# The dependency rule between engine parts (see ft_engine_part in ftune.cmake
# and docs/ARCHITECTURE.md): every project include ("common/...", "engine/...",
# "kernels/...", ...) in FILES must name a header in one of the ALLOWED
# folders. Fails with one line per offending include.
# cmake -DROOT=<source dir> -DPART=<dir> -DALLOWED=a|b|c -DFILES=f1|f2 -P check_layers.cmake
cmake_minimum_required(VERSION 3.22)  # IN_LIST
string(REPLACE "|" ";" allowed "${ALLOWED}")
string(REPLACE "|" ";" files "${FILES}")
set(project_dirs common kernels engine proto daemon worker cli bench tests web)
set(errors "")
foreach(file IN LISTS files)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*$" "\\1" header "${line}")
    string(REGEX MATCH "^[^/]+" top "${header}")
    get_filename_component(dir "${header}" DIRECTORY)
    if(dir STREQUAL "" OR NOT top IN_LIST project_dirs OR dir IN_LIST allowed)
      continue()
    endif()
    file(RELATIVE_PATH rel "${ROOT}" "${file}")
    string(REPLACE ";" ", " allowed_text "${allowed}")
    set(error "${rel}: includes \"${header}\", but ${PART} may include only ${allowed_text} "
              "(a part uses only the parts below it: docs/ARCHITECTURE.md)")
    string(CONCAT error ${error})
    # One unwrapped line per include (message() would wrap it).
    execute_process(COMMAND ${CMAKE_COMMAND} -E echo "${error}")
    set(errors TRUE)
  endforeach()
endforeach()
if(errors)
  message(FATAL_ERROR "wrong-way include in ${PART} (the lines above)")
endif()
