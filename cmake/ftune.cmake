# Helpers shared by every part: warnings for our own code, sanitizers, and one
# way to register a test with ctest.

# Warnings as errors, for our own targets only (never for dependencies).
# FT_WERROR is OFF for a plain configure (a packager's or user's compiler may be
# newer than ours and warn where ours does not); the trees we control turn it on:
# `make test` (CI), tests/sanitize/configure.sh and tests/build/engine-only.sh.
function(ft_project_warnings target)
  set(werror)
  set(cuda_werror)
  set(cuda_host_werror)
  if(FT_WERROR)
    set(werror -Werror)
    set(cuda_werror -Werror=all-warnings)
    set(cuda_host_werror ,-Werror)
  endif()
  # GCC 12 at -O3 (Release) reports std::string operations that inlining made
  # look unbounded: false -Wrestrict on `"literal" + std::string` chains (GCC bug
  # 105329, fixed in 13) and false -Wmaybe-uninitialized on moved strings in
  # aggregates (bug 105562). Off for GCC 12's Release builds only, so they build;
  # -O2 builds (RelWithDebInfo, CI's main tree) and other compilers keep both.
  set(gcc12_o3_false_positives)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
     AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    set(gcc12_o3_false_positives $<$<CONFIG:Release>:-Wno-restrict -Wno-maybe-uninitialized>)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic ${werror} -Wno-missing-field-initializers
                              ${gcc12_o3_false_positives}>
    # nvcc (13.0) wrongly flags assignment of a [[nodiscard]] class type (#2810).
    $<$<COMPILE_LANGUAGE:CUDA>:${cuda_werror} -diag-suppress=2810 -Xcompiler=-Wall,-Wextra${cuda_host_werror}>)
endfunction()

# FT_SANITIZED: code that budgets stack (engine/text/jinja) allows for the sanitizers' larger frames.
if(FT_SANITIZE STREQUAL "address")
  add_compile_definitions(FT_SANITIZED=1)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(FT_SANITIZE STREQUAL "thread")
  add_compile_definitions(FT_SANITIZED=1)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT FT_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FT_SANITIZE must be '', 'address' or 'thread', not '${FT_SANITIZE}'")
endif()
if(FT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FT_FUZZ=ON needs clang (configure with CMAKE_CXX_COMPILER=clang++)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)  # coverage for libFuzzer in every library
endif()

# ft_add_test(NAME SOURCES a.cc b.cc LIBS x y [LABELS l] [TIMEOUT s] [SHARDS n] [COST s])
# Builds one GoogleTest binary and registers it with ctest under NAME, or,
# with SHARDS n > 1, as NAME_shard0 .. NAME_shard<n-1>: GoogleTest's sharding
# (GTEST_TOTAL_SHARDS, GTEST_SHARD_INDEX) splits its tests between them, so
# ctest runs a long suite of slow scenarios side by side.
# COST: the seconds the test (each shard) takes on a 2-core machine, for the
# long ones. ctest starts the costliest first, but it learns costs only from
# earlier runs of the same tree; a fresh clone (CI, and each sanitizer tree)
# has none and would start tests in declaration order, ending the run with
# one long test on one core.
# Test code at -O1 (its libraries keep the build type's -O2): a test's own
# code orchestrates and asserts, and gtest's assertions in long test functions
# made -O2 the larger part of the build (daemon_http_api_test: 71 s at -O2,
# 42 s at -O1 on 2 cores, 2026-12). A Debug build keeps -O0; a target's own
# later options (e.g. -O3) still win.
# In the sanitizer trees, the tests of the folders that call ft_orchestration_code build at -O0.
function(ft_test_optimization target)
  if(FT_SANITIZE AND FT_ORCHESTRATION_CODE)
    set(level -O0)
  else()
    set(level -O1)
  endif()
  target_compile_options(${target} PRIVATE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<CONFIG:Debug>>>:${level}>)
endfunction()

# ft_orchestration_code(): called by the folders whose code orchestrates rather
# than computes and that link nothing that computes (daemon/, worker/, cli/,
# proto/ and their tests: tests/daemon, tests/worker, tests/e2e, tests/slurm,
# tests/web): in the sanitizer trees (FT_SANITIZE) their targets build at -O0.
# ASan's and TSan's instrumentation makes the optimiser's part of a compile
# most of it, and these folders a large part of those trees (under ASan:
# daemon/http_server.cc 192 s at -O2, 172 s at -O1, 62 s at -O0; a daemon test
# and a daemon source side by side 149 s at -O1, 54 s at -O0; 2 cores,
# 2026-12). Nothing that computes links -O0 code: the linker keeps one copy of
# each inline function (std::, nlohmann::json), so -O0 test code linked with
# the engine made the engine's tests run up to 7 times slower under ASan
# (engine_tokenizer_test 70 s -> 515 s): the engine, the kernels and their
# tests keep -O2 (tests -O1) there, and every folder keeps -O2 in the normal
# trees, which are what users run.
function(ft_orchestration_code)
  if(FT_SANITIZE)
    add_compile_options($<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<CONFIG:Debug>>>:-O0>)
  endif()
  set(FT_ORCHESTRATION_CODE ON PARENT_SCOPE)
endfunction()

function(ft_add_test name)
  cmake_parse_arguments(T "" "TIMEOUT;SHARDS;COST" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  ft_project_warnings(${name})
  ft_test_optimization(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gmock GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    FT_SOURCE_DIR="${PROJECT_SOURCE_DIR}" FT_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set(tests ${name})
  if(T_SHARDS GREATER 1)
    set(tests)
    math(EXPR last "${T_SHARDS} - 1")
    foreach(i RANGE ${last})
      add_test(NAME ${name}_shard${i} COMMAND ${name})
      set_tests_properties(${name}_shard${i} PROPERTIES
        ENVIRONMENT "GTEST_TOTAL_SHARDS=${T_SHARDS};GTEST_SHARD_INDEX=${i}")
      list(APPEND tests ${name}_shard${i})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name})
  endif()
  # OpenMP threads sleep when idle (ft-train's own default): libgomp's spinning ones made two
  # compute-bound tests side by side on 2 cores take 142 s instead of 37.
  set_tests_properties(${tests} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
                       ENVIRONMENT_MODIFICATION "OMP_WAIT_POLICY=set:passive")
  if(T_COST)
    set_tests_properties(${tests} PROPERTIES COST ${T_COST})
  endif()
  if("gpu" IN_LIST T_LABELS)
    # GPU tests GTEST_SKIP on machines without a GPU; ctest reports them skipped.
    set_tests_properties(${tests} PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
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

# ft_engine_part(TARGET DIR dir SOURCES a.cc ... [PARTS lower parts...] [INCLUDES dirs...] [LIBS libs...])
# One engine part: a library of the .cc/.cu files in `dir` (relative to the
# project root), linked to the parts below it (PARTS) and to outside libraries
# (LIBS). A part may include only its own folder, the folders of the parts it
# builds on (transitively) and INCLUDES (common, kernels/...). The build checks
# that before compiling the part (cmake/check_layers.cmake), so a wrong-way
# include — the tokenizer including the trainer — fails the build, naming the
# file and the rule.
function(ft_engine_part target)
  cmake_parse_arguments(P "" "DIR" "SOURCES;PARTS;INCLUDES;LIBS" ${ARGN})
  add_library(${target} ${P_SOURCES})
  target_link_libraries(${target} PUBLIC ${P_PARTS} ${P_LIBS})
  ft_project_warnings(${target})
  set(allowed ${P_DIR} ${P_INCLUDES})
  foreach(part IN LISTS P_PARTS)
    get_property(below GLOBAL PROPERTY FT_PART_ALLOWED_${part})
    list(APPEND allowed ${below})
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set_property(GLOBAL PROPERTY FT_PART_ALLOWED_${target} "${allowed}")
  file(GLOB files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${P_DIR}/*.h ${PROJECT_SOURCE_DIR}/${P_DIR}/*.cc
       ${PROJECT_SOURCE_DIR}/${P_DIR}/*.cu ${PROJECT_SOURCE_DIR}/${P_DIR}/*.cuh)
  string(REPLACE ";" "|" allowed_arg "${allowed}")
  string(REPLACE ";" "|" files_arg "${files}")
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/${target}.layers-ok)
  add_custom_command(
    OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -DPART=${P_DIR} -DALLOWED=${allowed_arg}
            -DFILES=${files_arg} -P ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
    COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
    DEPENDS ${files} ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
    COMMENT "Checking the includes of ${P_DIR}" VERBATIM)
  add_custom_target(${target}_layers DEPENDS ${stamp})
  add_dependencies(${target} ${target}_layers)
endfunction()

# ft_check_engine_links(TARGETS t1 t2 ... ALLOWED lib1 lib2 ...)
# Fails configuration when a target links, directly or through other
# libraries, an engine part (ft_engine_*) not in ALLOWED: ftd, ft-worker and
# ftctl link only the job contract (engine/job), never the tokenizers, Jinja,
# Gloo or backends. Names every offending path, e.g.
#   ftd links ft_engine_io (ftd -> ft_daemon -> ft_engine_io): ...
function(ft_check_engine_links)
  cmake_parse_arguments(C "" "" "TARGETS;ALLOWED" ${ARGN})
  set(errors "")
  foreach(top IN LISTS C_TARGETS)
    if(NOT TARGET ${top})
      continue()
    endif()
    set(queue ${top})
    set(seen ${top})
    set(path_${top} ${top})
    while(queue)
      list(POP_FRONT queue current)
      get_target_property(type ${current} TYPE)
      set(deps "")
      if(NOT type STREQUAL "INTERFACE_LIBRARY")
        get_target_property(direct ${current} LINK_LIBRARIES)
        if(direct)
          list(APPEND deps ${direct})
        endif()
      endif()
      get_target_property(iface ${current} INTERFACE_LINK_LIBRARIES)
      if(iface)
        list(APPEND deps ${iface})
      endif()
      foreach(dep IN LISTS deps)
        string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
        if(NOT TARGET ${dep} OR dep IN_LIST seen)
          continue()
        endif()
        list(APPEND seen ${dep})
        set(path_${dep} "${path_${current}} -> ${dep}")
        if(dep MATCHES "^ft_engine" AND NOT dep IN_LIST C_ALLOWED)
          string(APPEND errors "  ${top} links ${dep} (${path_${dep}})\n")
        endif()
        list(APPEND queue ${dep})
      endforeach()
    endwhile()
  endforeach()
  if(errors)
    string(REPLACE ";" ", " allowed_text "${C_ALLOWED}")
    message(FATAL_ERROR "the control plane links engine parts beyond ${allowed_text} "
                        "(docs/ARCHITECTURE.md, engine/job):\n${errors}")
  endif()
endfunction()
