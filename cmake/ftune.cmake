# Helpers shared by every part: warnings for our own code, sanitizers, and one
# way to register a test with ctest.

# Warnings as errors, for our own targets only (never for dependencies).
function(ft_project_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-missing-field-initializers>
    # nvcc (13.0) wrongly flags assignment of a [[nodiscard]] class type (#2810).
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -diag-suppress=2810 -Xcompiler=-Wall,-Wextra,-Werror>)
endfunction()

if(FT_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(FT_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT FT_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FT_SANITIZE must be '', 'address' or 'thread', not '${FT_SANITIZE}'")
endif()

# ft_add_test(NAME SOURCES a.cc b.cc LIBS x y [LABELS l] [TIMEOUT s])
# Builds one GoogleTest binary and registers it with ctest under NAME.
function(ft_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  ft_project_warnings(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    FT_SOURCE_DIR="${PROJECT_SOURCE_DIR}" FT_BINARY_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if("gpu" IN_LIST T_LABELS)
    # GPU tests GTEST_SKIP on machines without a GPU; ctest reports them skipped.
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endfunction()

# ft_npm_fixture(NAME GOLDEN_DIR): a ctest fixture (NAME_npm) that installs the
# npm packages pinned by GOLDEN_DIR/package-lock.json into
# ${CMAKE_BINARY_DIR}/npm-NAME (npm ci; skipped while the lock file is
# unchanged since the last successful install). Sets FT_NPM_MODULES_NAME to its
# node_modules directory in the caller's scope.
function(ft_npm_fixture name golden_dir)
  set(dest ${CMAKE_BINARY_DIR}/npm-${name})
  add_test(NAME ${name}_npm_install
           COMMAND sh -c "set -e; mkdir -p '${dest}'; cd '${dest}'; \
if cmp -s '${golden_dir}/package-lock.json' package-lock.json && [ -f node_modules/.installed ]; then \
echo 'npm-${name}: up to date'; exit 0; fi; \
cp '${golden_dir}/package.json' '${golden_dir}/package-lock.json' .; \
npm ci --no-audit --no-fund; touch node_modules/.installed")
  set_tests_properties(${name}_npm_install PROPERTIES FIXTURES_SETUP ${name}_npm TIMEOUT 900 LABELS npm)
  set(FT_NPM_MODULES_${name} ${dest}/node_modules PARENT_SCOPE)
endfunction()
