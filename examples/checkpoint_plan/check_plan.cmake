# Runs checkpoint_plan and checks what it prints; used by the checkpoint_plan_* tests.
#   -DEXE=... -DARGS=a|b|c -DEXPECT_COST=N   the JSON plan's "cost" must be N
#   -DEXE=... -DROUNDTRIP=model -DWORK=dir  --dump, then --graph on the dump == --model
#   -DEXE=... -DBAD_JSON=1 -DWORK=dir       a syntax error is reported as file:line:column: key
#   -DEXE=... -DBUDGET=model                --budget at the model's least recompute-only memory
#                                           (from --model): within it, and faster with storage
#                                           than --recompute-only; --frontier starts there;
#                                           --budget --frontier marks the plan's point;
#                                           --int8 is faster still; --max-points and
#                                           --bound-ratio (or --fast) give a heuristic in fewer
#                                           passes
#   -DEXE=... -DTABLE=1                     the model table: every model's row, checked against
#                                           the input sizes and cut-offs the seed published and
#                                           against the JSON plan of the same model
cmake_minimum_required(VERSION 3.25)

function(run_plan out_var)
  execute_process(COMMAND ${EXE} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "checkpoint_plan ${ARGN} failed (${rc}): ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# Tenths of a percent (an integer) as "X.Y%", for messages.
function(percent out_var tenths)
  math(EXPR whole "${tenths} / 10")
  math(EXPR frac "${tenths} % 10")
  if(tenths LESS 0 AND NOT frac EQUAL 0)
    math(EXPR frac "-${frac}")
    if(whole EQUAL 0)
      set(whole "-0")
    endif()
  endif()
  set(${out_var} "${whole}.${frac}%" PARENT_SCOPE)
endfunction()

if(DEFINED EXPECT_COST)
  string(REPLACE "|" ";" args "${ARGS}")
  run_plan(out ${args})
  string(JSON cost GET "${out}" cost)
  string(JSON regular GET "${out}" regular_cost)
  string(JSON n_segments LENGTH "${out}" segments)
  if(NOT cost EQUAL EXPECT_COST)
    message(FATAL_ERROR "plan cost ${cost}, expected ${EXPECT_COST}\n${out}")
  endif()
  message(STATUS "cost ${cost} (regular ${regular}, ${n_segments} segments)")
elseif(DEFINED ROUNDTRIP)
  run_plan(graph --dump ${ROUNDTRIP})
  file(WRITE ${WORK}/${ROUNDTRIP}.json "${graph}")
  run_plan(direct --model ${ROUNDTRIP})
  run_plan(read --graph ${WORK}/${ROUNDTRIP}.json)
  string(JSON a GET "${direct}" cost)
  string(JSON b GET "${read}" cost)
  string(JSON ca LENGTH "${direct}" checkpoints)
  string(JSON cb LENGTH "${read}" checkpoints)
  if(NOT a EQUAL b OR NOT ca EQUAL cb)
    message(FATAL_ERROR "--model gives cost ${a} (${ca} checkpoints), --graph on the dump ${b} (${cb})")
  endif()
  message(STATUS "cost ${a}, ${ca} checkpoints both ways")
elseif(DEFINED BUDGET)
  run_plan(base --model ${BUDGET})
  string(JSON least GET "${base}" cost)
  # --budget takes MiB; give the least in MiB, rounded up to 1/1024 MiB (1 KiB) above it.
  math(EXPR kib "(${least} + 1023) / 1024")
  math(EXPR whole "${kib} / 1024")
  math(EXPR frac "${kib} % 1024")
  math(EXPR budget_bytes "${kib} * 1024")
  # MiB with enough decimals: whole + frac / 1024 written exactly (1/1024 = 0.0009765625).
  math(EXPR frac_digits "${frac} * 9765625")
  string(LENGTH "${frac_digits}" len)
  while(len LESS 10)
    set(frac_digits "0${frac_digits}")
    math(EXPR len "${len} + 1")
  endwhile()
  set(mib "${whole}.${frac_digits}")
  run_plan(with --model ${BUDGET} --budget ${mib})
  run_plan(without --model ${BUDGET} --budget ${mib} --recompute-only)
  string(JSON with_cost GET "${with}" cost)
  string(JSON with_time GET "${with}" extra_time)
  string(JSON without_time GET "${without}" extra_time)
  string(JSON packed LENGTH "${with}" compressed)
  string(JSON none LENGTH "${without}" compressed)
  if(with_cost GREATER budget_bytes OR packed EQUAL 0 OR NOT none EQUAL 0 OR
     NOT with_time LESS without_time)
    message(FATAL_ERROR "budget ${mib} MiB (${budget_bytes} B): with storage cost ${with_cost}, "
                        "time ${with_time}, ${packed} compressed; recompute-only time "
                        "${without_time}, ${none} compressed")
  endif()
  # --int8: the model's other inner tensors offer int8 storage too: within the budget, and
  # faster than MinK storage alone (ResNet-50 recomputes almost nothing then).
  run_plan(with8 --model ${BUDGET} --int8 --budget ${mib})
  string(JSON int8_cost GET "${with8}" cost)
  string(JSON int8_time GET "${with8}" extra_time)
  string(JSON int8_packed LENGTH "${with8}" compressed)
  if(int8_cost GREATER budget_bytes OR NOT int8_time LESS with_time OR
     NOT int8_packed GREATER packed)
    message(FATAL_ERROR "--int8 --budget ${mib}: cost ${int8_cost}, time ${int8_time}, "
                        "${int8_packed} compressed; with MinK only: time ${with_time}, ${packed}")
  endif()
  execute_process(COMMAND ${EXE} --graph nothing.json --int8 OUTPUT_QUIET ERROR_QUIET
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "--int8 with --graph: exit ${rc}, expected the usage (2)")
  endif()
  run_plan(front --model ${BUDGET} --frontier)
  if(NOT front MATCHES "^# [0-9]+ points, exact")
    message(FATAL_ERROR "--frontier printed: ${front}")
  endif()
  # The speed knobs: a heuristic frontier, in fewer passes, never below the least memory (the
  # exact frontier's first point); bad values and knobs without --budget/--frontier: the usage.
  run_plan(fast --model ${BUDGET} --frontier --max-points 64 --bound-ratio 0.5)
  string(REGEX MATCH "^# [0-9]+ points, exact, ([0-9]+) passes[^\n]*\n[^\n]*\n *([0-9]+) " _
         "${front}")
  set(exact_passes ${CMAKE_MATCH_1})
  set(exact_least ${CMAKE_MATCH_2})
  string(REGEX MATCH "^# [0-9]+ points, heuristic, ([0-9]+) passes[^\n]*\n[^\n]*\n *([0-9]+) " _
         "${fast}")
  if(NOT CMAKE_MATCH_1 OR NOT exact_passes OR NOT CMAKE_MATCH_1 LESS exact_passes OR
     CMAKE_MATCH_2 LESS exact_least)
    message(FATAL_ERROR "--max-points 64 --bound-ratio 0.5 printed:\n${fast}\nexact: "
                        "${exact_passes} passes, least memory ${exact_least}")
  endif()
  # --fast: budget_options::fast()'s knobs, a heuristic as above.
  run_plan(preset --model ${BUDGET} --frontier --fast)
  string(REGEX MATCH "^# [0-9]+ points, heuristic, ([0-9]+) passes[^\n]*\n[^\n]*\n *([0-9]+) " _
         "${preset}")
  if(NOT CMAKE_MATCH_1 OR NOT CMAKE_MATCH_1 LESS exact_passes OR CMAKE_MATCH_2 LESS exact_least)
    message(FATAL_ERROR "--fast printed:\n${preset}\nexact: ${exact_passes} passes, least "
                        "memory ${exact_least}")
  endif()
  foreach(bad "--frontier;--bound-ratio;-1" "--frontier;--max-points;0" "--max-points;64"
          "--fast")
    execute_process(COMMAND ${EXE} --model ${BUDGET} ${bad} OUTPUT_QUIET ERROR_QUIET
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 2)
      message(FATAL_ERROR "${bad}: exit ${rc}, expected the usage (2)")
    endif()
  endforeach()
  # --budget with --frontier: the frontier, the budget's plan marked (its memory, from the JSON).
  run_plan(marked --model ${BUDGET} --budget ${mib} --frontier)
  string(REGEX MATCHALL "[^\n]*<- the plan within the budget" marks "${marked}")
  list(LENGTH marks n_marks)
  if(NOT n_marks EQUAL 1 OR NOT marks MATCHES "^ *${with_cost} ")
    message(FATAL_ERROR "--budget ${mib} --frontier marked ${n_marks} points (${marks}); the "
                        "plan costs ${with_cost}")
  endif()
  message(STATUS "budget ${mib} MiB: ${with_time} with storage (${packed} compressed) vs "
                 "${without_time}")
elseif(DEFINED BAD_JSON)
  file(WRITE ${WORK}/bad.json "{\"source\": 0, \"target\": 1,\n  \"vertices\": [{\"id\": 0, \"cost\": 1},]\n}\n")
  execute_process(COMMAND ${EXE} --graph ${WORK}/bad.json OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 1 OR
     NOT err MATCHES "bad\\.json:2:37: vertices\\[1\\]: syntax error [^\n]*unexpected '\\]'")
    message(FATAL_ERROR "expected exit 1 and bad.json:2:37: vertices[1], got ${rc}: ${err}")
  endif()
  message(STATUS "rejected: ${err}")
elseif(DEFINED TABLE)
  # What the seed published (model, input size, its cut-off in %): the table must list these
  # models at these sizes. Nothing here comes from the code under test.
  set(seed_rows
      "alexnet|(1024,3,224,224)|34" "vgg11|(64,3,224,224)|22" "vgg13|(64,3,224,224)|31"
      "vgg16|(64,3,224,224)|31" "vgg19|(64,3,224,224)|31" "resnet18|(256,3,224,224)|35"
      "resnet34|(128,3,224,224)|55" "resnet50|(64,3,224,224)|63" "resnet101|(32,3,224,224)|74"
      "resnet152|(16,3,224,224)|81" "densenet121|(32,3,224,224)|78"
      "densenet161|(16,3,224,224)|82" "densenet169|(32,3,224,224)|82"
      "densenet201|(16,3,224,224)|85" "inception_v3|(32,3,300,300)|71")
  run_plan(table)
  string(REPLACE "\n" ";" lines "${table}")
  # model input verts regular planned cut-off% | seedMB->MB seed% | overhead% seed% | solve-ms
  set(n "[0-9]+")
  set(d "[0-9]+\\.[0-9]")
  set(row_re "^[a-z0-9_]+ +\\([0-9,]+\\) +${n} +${n} +${n} +${d}% \\| +${n}->${n} +${n}% "
             "\\| +${d}% +${n}% \\| +[0-9]+\\.[0-9]+$")
  string(JOIN "" row_re ${row_re})
  set(rows 0)
  set(problems "")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^[a-z0-9_]+ +\\(")
      continue()  # the title, the header and the notes
    endif()
    math(EXPR rows "${rows} + 1")
    if(NOT line MATCHES "${row_re}")
      string(APPEND problems "malformed row: '${line}'\n")
      continue()
    endif()
    # Tenths of a percent, so that math(EXPR) (integers only) can compare them.
    string(REGEX REPLACE "([0-9]+)\\.([0-9])%" "\\1\\2" fields "${line}")
    string(REGEX REPLACE "%" "" fields "${fields}")
    string(REGEX REPLACE " +" ";" fields "${fields}")
    list(GET fields 0 model)
    list(GET fields 1 input)
    list(GET fields 2 verts)
    list(GET fields 3 regular)
    list(GET fields 4 planned)
    list(GET fields 5 cut_tenths)
    list(GET fields 8 seed_cut)
    list(GET fields 10 overhead_tenths)
    string(REGEX REPLACE "^0+([0-9])" "\\1" cut_tenths "${cut_tenths}")
    string(REGEX REPLACE "^0+([0-9])" "\\1" overhead_tenths "${overhead_tenths}")
    set(expected "")
    foreach(r IN LISTS seed_rows)
      if(r MATCHES "^${model}\\|")
        set(expected "${r}")
      endif()
    endforeach()
    if(expected STREQUAL "")
      string(APPEND problems "${model}: not one of the seed's models\n")
      continue()
    endif()
    list(APPEND seen ${model})
    if(NOT "${model}|${input}|${seed_cut}" STREQUAL expected)
      string(APPEND problems "${model}: input ${input}, seed cut-off ${seed_cut}%; the seed "
                             "published ${expected}\n")
    endif()
    # The cost model: something saved, something kept.
    if(NOT (planned GREATER 0 AND planned LESS regular))
      string(APPEND problems "${model}: planned ${planned} MiB is not in (0, regular ${regular})\n")
    endif()
    # The cut-off is what the two memory columns say, and plausible next to the seed's: the cost
    # model counts only stored forward tensors (what checkpointing removes), the seed's allocator
    # also gradients and workspaces, so ours is not far below the seed's (all 15 are above it).
    math(EXPR from_columns "(2000 * (${regular} - ${planned}) / ${regular} + 1) / 2")
    math(EXPR diff "${from_columns} - ${cut_tenths}")
    if(diff GREATER 2 OR diff LESS -2)
      percent(printed ${cut_tenths})
      percent(computed ${from_columns})
      string(APPEND problems "${model}: cut-off ${printed}, but 1 - ${planned}/${regular} is "
                             "${computed}\n")
    endif()
    math(EXPR seed_floor "${seed_cut} * 10 - 50")
    if(cut_tenths LESS seed_floor OR cut_tenths GREATER_EQUAL 1000)
      percent(printed ${cut_tenths})
      string(APPEND problems "${model}: cut-off ${printed} is implausible (the seed measured "
                             "${seed_cut}%)\n")
    endif()
    # Each segment is recomputed once at most: at most one forward of three (forward + backward).
    if(overhead_tenths LESS_EQUAL 0 OR overhead_tenths GREATER 334)
      percent(printed ${overhead_tenths})
      string(APPEND problems "${model}: recompute ${printed} is outside (0, 33.4%]\n")
    endif()
    # The same model planned through --model: the row shows its memory and vertex count (every
    # vertex is the source, the target, a checkpoint or inside exactly one segment).
    run_plan(plan --model ${model})
    string(JSON cost GET "${plan}" cost)
    string(JSON regular_cost GET "${plan}" regular_cost)
    string(JSON n_checkpoints LENGTH "${plan}" checkpoints)
    string(JSON n_segments LENGTH "${plan}" segments)
    math(EXPR counted "2 + ${n_checkpoints}")
    if(n_segments GREATER 0)
      math(EXPR last "${n_segments} - 1")
      foreach(i RANGE ${last})
        string(JSON n LENGTH "${plan}" segments ${i} vertices)
        math(EXPR counted "${counted} + ${n}")
      endforeach()
    endif()
    # The printed MiB must be a rounding of the bytes: within half a MiB.
    math(EXPR cost_off "${cost} - ${planned} * 1048576")
    math(EXPR regular_off "${regular_cost} - ${regular} * 1048576")
    if(cost_off GREATER 524288 OR cost_off LESS -524288 OR regular_off GREATER 524288 OR
       regular_off LESS -524288 OR NOT counted EQUAL verts)
      string(APPEND problems "${model}: row says ${verts} vertices, ${regular} -> ${planned} MiB; "
                             "--model gives ${counted} vertices, ${regular_cost} -> ${cost} "
                             "bytes\n")
    endif()
  endforeach()
  foreach(r IN LISTS seed_rows)
    string(REGEX REPLACE "\\|.*" "" model "${r}")
    list(FIND seen ${model} at)
    if(at EQUAL -1)
      string(APPEND problems "${model}: no row\n")
    endif()
  endforeach()
  list(LENGTH seed_rows expected_rows)
  if(NOT rows EQUAL expected_rows)
    string(APPEND problems "${rows} rows, expected ${expected_rows}\n")
  endif()
  if(NOT problems STREQUAL "")
    message(FATAL_ERROR "${problems}\n${table}")
  endif()
  message(STATUS "${rows} rows checked")
else()
  message(FATAL_ERROR "check_plan.cmake: nothing to check")
endif()
