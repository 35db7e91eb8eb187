# The command's rooms include only what lies below them: model/ reads dumps (no rules, no
# sentences), rules/ decides on the model (no sentences), render/ words the report (never
# decides); report/ is the vocabulary between rules and render; debuginfo/ reads debug info for
# the model's frames (no verdicts, no sentences). Run: cmake -DROOT=<tools/ncclwatch> -P
set(_forbidden
  "model:rules/;render/;debuginfo/"
  "rules:render/"
  "render:rules/;debuginfo/"
  "report:rules/;render/;debuginfo/"
  "debuginfo:rules/;render/")
set(_bad "")
foreach(entry ${_forbidden})
  string(REPLACE ":" ";" parts "${entry}")
  list(GET parts 0 room)
  list(REMOVE_AT parts 0)
  file(GLOB files "${ROOT}/${room}/*.h" "${ROOT}/${room}/*.cpp")
  if(NOT files)
    message(FATAL_ERROR "check_layers: no sources in ${ROOT}/${room}")
  endif()
  foreach(f ${files})
    file(STRINGS "${f}" includes REGEX "^#include \"")
    foreach(inc ${includes})
      foreach(other ${parts})
        if(inc MATCHES "^#include \"${other}")
          list(APPEND _bad "${f}: ${inc}")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(_bad)
  string(REPLACE ";" "\n  " _bad "${_bad}")
  message(FATAL_ERROR "check_layers: an include against the layering:\n  ${_bad}")
endif()
message(STATUS "check_layers: model < rules < render, report between, debuginfo beside: ok")
