# Writes BuiltinRules.inc: one {name, text} entry per rule file.
# Usage: cmake -DOUT=<file> -DRULES="a.mlir;b.mlir" -P EmbedRules.cmake
set(content "// Generated from lib/Rules/*.mlir by EmbedRules.cmake. Do not edit.\n")
foreach(rule ${RULES})
  get_filename_component(name ${rule} NAME_WE)
  file(READ ${rule} text)
  string(APPEND content "{\"${name}\", R\"flashopt_rule(${text})flashopt_rule\"},\n")
endforeach()
file(WRITE ${OUT}.tmp "${content}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
