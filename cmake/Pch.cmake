# Precompiled headers (ULYSSES_PCH, on by default).
#
# Most of a unit's compile time is the big headers it includes, not its own code: libtorch's
# <torch/torch.h> in the engine; gRPC, the generated ulysses.v1 stubs and Abseil in the control
# plane; GoogleTest and GMock in the tests. Each family is precompiled once per variant, and
# ulysses_apply_pch() makes every target reuse the one that fits it:
#
#   family  headers                                  targets
#   torch   <torch/torch.h>                          that carry libtorch
#   grpc    gRPC, ulysses.v1 stubs, Abseil strings   that carry gRPC but not libtorch (Clang)
#   base    Abseil strings and status                test executables that carry neither (Clang)
#
# A test executable's variant adds GoogleTest and GMock. Executables compile with -fPIE and
# libraries with -fPIC (CMAKE_POSITION_INDEPENDENT_CODE), and a header precompiled with one is
# refused with the other, so executables get their own variant.
#
# Clang keeps the templates the headers instantiate in the precompiled header (CMake passes
# -fpch-instantiate-templates); GCC instantiates them again in every unit, where a gRPC
# header unit saves nothing (measured), so with GCC only the torch family is used.
# Figures: docs/BENCHMARKS.md "Build time".
option(ULYSSES_PCH "Precompile the big third-party headers once per family" ON)

set(_ULYSSES_PCH_HEADERS_torch <torch/torch.h>)
set(_ULYSSES_PCH_LIBS_torch ${TORCH_LIBRARIES})
set(_ULYSSES_PCH_HEADERS_grpc <grpcpp/grpcpp.h> <ulysses/v1/job_service.grpc.pb.h>
    <ulysses/v1/worker_service.grpc.pb.h> <absl/status/statusor.h> <absl/strings/str_cat.h>
    <absl/strings/str_format.h>)
set(_ULYSSES_PCH_LIBS_grpc ulysses_proto absl::statusor absl::strings absl::str_format)
set(_ULYSSES_PCH_HEADERS_base <absl/status/statusor.h> <absl/strings/str_cat.h>
    <absl/strings/str_format.h>)
set(_ULYSSES_PCH_LIBS_base absl::statusor absl::strings absl::str_format)
set(_ULYSSES_PCH_HEADERS_test <gtest/gtest.h> <gmock/gmock.h>)
set(_ULYSSES_PCH_LIBS_test GTest::gtest GTest::gmock)

# TRUE in `out` when `item` (a target name from a link list) carries `lib`'s usage
# requirements, directly or through its dependencies' INTERFACE_LINK_LIBRARIES.
# $<LINK_ONLY:...> entries carry none and are skipped.
function(_ulysses_carries item lib out)
  set(result FALSE)
  if(item STREQUAL lib)
    set(result TRUE)
  elseif(TARGET "${item}")
    set(key "_ULYSSES_CARRIES_${lib}_${item}")
    get_property(known GLOBAL PROPERTY "${key}" SET)
    if(known)
      get_property(result GLOBAL PROPERTY "${key}")
    else()
      set_property(GLOBAL PROPERTY "${key}" FALSE)  # Cycles end here.
      get_target_property(deps "${item}" INTERFACE_LINK_LIBRARIES)
      if(NOT deps)
        set(deps "")
      endif()
      foreach(dep IN LISTS deps)
        if(dep MATCHES "^\\$<LINK_ONLY:")
          continue()
        endif()
        _ulysses_carries("${dep}" "${lib}" dep_result)
        if(dep_result)
          set(result TRUE)
          break()
        endif()
      endforeach()
      set_property(GLOBAL PROPERTY "${key}" ${result})
    endif()
  endif()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# TRUE in `out` when target `tgt` links (directly or through a dependency) `lib`.
function(_ulysses_target_carries tgt lib out)
  get_target_property(links ${tgt} LINK_LIBRARIES)
  set(result FALSE)
  if(links)
    foreach(item IN LISTS links)
      _ulysses_carries("${item}" "${lib}" result)
      if(result)
        break()
      endif()
    endforeach()
  endif()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# The object library that precompiles `family` for executables (`exe`) or libraries, with
# GoogleTest and GMock when `test`: created on first use; its name in `out`.
function(_ulysses_pch_target family exe test out)
  set(name ulysses_pch_${family})
  set(headers ${_ULYSSES_PCH_HEADERS_${family}})
  set(libs ${_ULYSSES_PCH_LIBS_${family}})
  if(test)
    string(APPEND name _test)
    list(APPEND headers ${_ULYSSES_PCH_HEADERS_test})
    list(APPEND libs ${_ULYSSES_PCH_LIBS_test})
  endif()
  if(exe)
    string(APPEND name _exe)
  endif()
  if(NOT TARGET ${name})
    add_library(${name} OBJECT ${CMAKE_SOURCE_DIR}/cmake/pch_anchor.cc)
    target_link_libraries(${name} PRIVATE ${libs})
    target_precompile_headers(${name} PRIVATE ${headers})
    if(exe)
      set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${name} PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
    endif()
    if(CMAKE_CXX_COMPILER_ID MATCHES Clang)
      # No build time stamped into the header unit: ccache can cache the units that use it.
      target_compile_options(${name} PRIVATE -Xclang -fno-pch-timestamp)
    endif()
  endif()
  set(${out} ${name} PARENT_SCOPE)
endfunction()

# Every C++ target under `dir` (recursively) reuses its family's precompiled header (see the
# table above). Called once from the top-level CMakeLists.txt after every subdirectory.
function(ulysses_apply_pch dir)
  if(NOT ULYSSES_PCH)
    return()
  endif()
  set(clang FALSE)
  if(CMAKE_CXX_COMPILER_ID MATCHES Clang)
    set(clang TRUE)
  endif()
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(tgt IN LISTS targets)
    if(tgt MATCHES "^ulysses_pch_")
      continue()
    endif()
    get_target_property(type ${tgt} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    get_target_property(links ${tgt} LINK_LIBRARIES)
    set(exe FALSE)
    set(test FALSE)
    if(type STREQUAL "EXECUTABLE")
      set(exe TRUE)
      if(links AND "ulysses_test_main" IN_LIST links)
        set(test TRUE)
      endif()
    endif()
    _ulysses_target_carries(${tgt} torch torch)
    set(family "")
    if(torch)
      set(family torch)
    elseif(clang)
      set(grpc FALSE)
      if(TARGET gRPC::grpc++)
        _ulysses_target_carries(${tgt} gRPC::grpc++ grpc)
      endif()
      if(grpc)
        set(family grpc)
      elseif(test)
        set(family base)
      endif()
    endif()
    # A library the header unit itself is built from (ulysses_proto, whose generated headers
    # the grpc family holds) cannot reuse it.
    if(family AND NOT tgt IN_LIST _ULYSSES_PCH_LIBS_${family})
      _ulysses_pch_target(${family} ${exe} ${test} pch)
      target_precompile_headers(${tgt} REUSE_FROM ${pch})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    ulysses_apply_pch("${sub}")
  endforeach()
endfunction()
