#!/usr/bin/env bash
# A fair comparison of distillation arms (issue 25), every arm run in one go from the same start: the demo's
# warm-started model (where GRPO alone learns), the demo's trained model as the teacher (served by
# python -m rlinf_search.serve). Arms:
#   grpo        GRPO alone (the teacher only measures: algorithm.distill.coef 0)
#   grpo_rkl    GRPO + the sampled-token reverse-KL term (coef DISTILL_COEF)
#   grpo_topk   GRPO + the teacher's top-k KL (top_k DISTILL_TOP_K, coef 0)
#   topk_only   the top-k KL alone (mode only)
#   sft_teacher the offline baseline: SFT on the teacher's own trajectories (toolkits/teacher_sft.py), as many
#               as the RL arms sample (30 steps x 16 questions x 4), the RL actor's optimizer settings
# Phase 1: every arm at every lr of DISTILL_LRS on the first seed; each arm's lr is the one with the best
# validation EM at the last step (held-out test questions are never used to choose). Phase 2: the other
# seeds at that lr. Held-out test EM at steps 10, 20, 30 of every run (its checkpoints). Ends with a table
# (mean and spread over seeds) and distill_compare.png.
#   bash scripts/distill_compare.sh                       # runs scripts/demo.sh first when DEMO_OUT has no model
#   DISTILL_ARMS="grpo grpo_topk" DISTILL_LRS=1e-4 DISTILL_SEEDS=0 DISTILL_RL_STEPS=2 bash scripts/distill_compare.sh
# With the defaults: 5 arms x 3 lrs + 5 arms x 2 seeds = 25 runs of 30 steps, each with 3 evaluations.
# DISTILL_START=no_search starts every arm from the student that cannot search instead (built once under
# DISTILL_OUT/student the way scripts/distill_demo.sh builds it: corpus, comprehension, then the format only;
# greedy, it never searches, so GRPO alone has nothing to reinforce): the comparison of docs/history/results.md, part 2:
#   DISTILL_START=no_search DISTILL_ARMS="grpo_topk sft_teacher" DISTILL_LRS=3e-3 DISTILL_SEEDS="0 1" \
#     DISTILL_RL_STEPS=100 DISTILL_EVAL_EVERY=50 DISTILL_OUT=outputs/distill_no_search bash scripts/distill_compare.sh
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
cd "$ROOT"
DEMO="${DEMO_OUT:-outputs/demo}"
OUT="${DISTILL_OUT:-outputs/distill_compare}"
ARMS="${DISTILL_ARMS:-grpo grpo_rkl grpo_topk topk_only sft_teacher}"
LRS="${DISTILL_LRS:-3e-5 1e-4 3e-4}"  # around the demo's GRPO lr (1e-4)
SEEDS="${DISTILL_SEEDS:-0 1 2}"
STEPS="${DISTILL_RL_STEPS:-30}"
EVERY="${DISTILL_EVAL_EVERY:-10}"  # checkpoints (and held-out evaluations) every this many steps
COEF="${DISTILL_COEF:-1.0}"
TOP_K="${DISTILL_TOP_K:-8}"
EVAL_N="${DISTILL_EVAL_N:-300}"
TOPK=1  # passages per search, as in scripts/demo.sh
START="${DISTILL_START:-warm}"
case "$START" in
    warm) STUDENT="$DEMO/model/sft" ;;  # the demo's warm start: GRPO alone learns from here
    no_search) STUDENT="$OUT/student" ;;
    *) echo "distill_compare: unknown DISTILL_START $START (warm, no_search)" >&2; exit 2 ;;
esac
# The demo's trained model by default. It is the demo's own GRPO run on the demo's seed: an arm on that seed
# that trains like it converges onto it (the pilot's GRPO arm ended at reverse KL 0.007). Name a stronger
# teacher (DISTILL_TEACHER: a longer run, another seed, a larger model) for a comparison that means something.
TEACHER="${DISTILL_TEACHER:-$DEMO/rl/checkpoints/global_step_30/hf_model}"
for arm in $ARMS; do  # before anything starts
    case "$arm" in grpo | grpo_rkl | grpo_topk | topk_only | sft_teacher) ;;
        *) echo "distill_compare: unknown arm $arm in DISTILL_ARMS (grpo, grpo_rkl, grpo_topk, topk_only, sft_teacher)" >&2; exit 2 ;;
    esac
done
export HF_HUB_DISABLE_PROGRESS_BARS="${HF_HUB_DISABLE_PROGRESS_BARS:-1}"
step() { printf '\n== %s\n' "$*"; }
mkdir -p "$OUT/runs"

if [ ! -d "$TEACHER" ] || [ ! -d "$DEMO/model/sft" ]; then
    step "0/4 no demo at $DEMO: running the demo first (about 15 minutes)"
    DEMO_OUT="$DEMO" bash scripts/demo.sh
fi

step "1/4 retrieval and teacher servers on free loopback ports"
source "$ROOT/scripts/distill_servers.sh"
start_distill_servers "$DEMO" "$OUT" "$TEACHER"
if [ "$START" = no_search ] && [ ! -f "$STUDENT/done" ]; then
    step "1b/4 the student that cannot search: the demo's untrained model, 300 steps on the corpus, 150 on answers, 100 on the format"
    rm -rf "$STUDENT"
    "$PY" -m toolkits.sft_warmstart --model "$DEMO/model/base" --data "$DEMO/data/train.prepared.jsonl" \
        --server-addr "$ADDR" --out "$STUDENT" --corpus-steps 300 --comprehension-steps 150 --reading-steps 0 \
        --skill-steps 0 --mix-steps 100 --topk "$TOPK" --lr 3e-3 --seed 0
    "$PY" -m rlinf_search.runners.eval_runner --model "$STUDENT" --data "$DEMO/data/test.prepared.jsonl" \
        --server-addr "$ADDR" --topk "$TOPK" --max-new-tokens 64 --max-samples "$EVAL_N" --out "$STUDENT/eval" | tail -n 1
    touch "$STUDENT/done"
fi
echo "retrieval at $ADDR, teacher at $TEACHER_ADDR ($TEACHER), student $STUDENT"

arm_overrides() {  # the algorithm.distill keys of one arm
    case "$1" in
        grpo) echo "algorithm.distill.coef=0 algorithm.distill.top_k=0" ;;
        grpo_rkl) echo "algorithm.distill.coef=$COEF algorithm.distill.top_k=0" ;;
        grpo_topk) echo "algorithm.distill.coef=0 algorithm.distill.top_k=$TOP_K" ;;
        topk_only) echo "algorithm.distill.mode=only algorithm.distill.coef=0 algorithm.distill.top_k=$TOP_K" ;;
    esac
}

train_arm() {  # arm lr seed dir: the training part of one run
    if [ "$1" = sft_teacher ]; then  # the shape of the RL runs (tiny-cpu.yaml) given to the offline baseline
        "$PY" -m toolkits.teacher_sft --teacher "$TEACHER" --student "$STUDENT" --out "$4" --lr "$2" --seed "$3" \
            --data "$DEMO/data/train.prepared.jsonl" --val-data "$DEMO/data/val.prepared.jsonl" --server-addr "$ADDR" \
            --topk "$TOPK" --steps "$STEPS" --save-every "$EVERY"
        return
    fi
    # shellcheck disable=SC2046  # the overrides are words
    "$PY" examples/searchr1/main_searchr1.py --config-name tiny-cpu-distill runner.output_dir="$4" \
        runner.max_steps="$STEPS" runner.resume_dir=null runner.save_interval="$EVERY" runner.val_check_interval="$EVERY" \
        rollout.model.model_path="$STUDENT" algorithm.distill.teacher.base_url="http://$TEACHER_ADDR/v1" \
        tools.search.server_addr="$ADDR" tools.search.topk="$TOPK" data.seed="$3" \
        data.train_data_paths="[$DEMO/data/train.prepared.jsonl]" data.val_data_paths="[$DEMO/data/val.prepared.jsonl]" \
        actor.optim.lr="$2" $(arm_overrides "$1")
}

run_arm() {  # arm lr seed: one run of STEPS steps, then held-out EM at each checkpoint; skipped when done
    local arm="$1" lr="$2" seed="$3" name="$1_lr$2_s$3" dir="$OUT/runs/$1_lr$2_s$3"
    if [ -f "$dir/done" ]; then echo "$name: done before"; return; fi
    rm -rf "$dir"
    train_arm "$arm" "$lr" "$seed" "$dir" > "$dir.log" 2>&1 || { echo "$name failed; see $dir.log" >&2; exit 1; }
    for at in $(seq "$EVERY" "$EVERY" "$STEPS"); do
        "$PY" -m rlinf_search.runners.eval_runner --model "$dir/checkpoints/global_step_$at/hf_model" \
            --data "$DEMO/data/test.prepared.jsonl" --server-addr "$ADDR" --topk "$TOPK" --max-new-tokens 64 \
            --max-samples "$EVAL_N" --out "$dir/eval/step_$at" > "$dir/eval_step_$at.log" 2>&1
    done
    touch "$dir/done"
    echo "$name: held-out $(grep '^overall' "$dir/eval_step_$STEPS.log" | awk '{print "EM " $3 ", F1 " $5}') at step $STEPS"
}

FIRST_SEED="${SEEDS%% *}"
step "2/4 learning-rate grid on seed $FIRST_SEED: arms [$ARMS] x lrs [$LRS], $STEPS steps each"
for arm in $ARMS; do for lr in $LRS; do run_arm "$arm" "$lr" "$FIRST_SEED"; done; done

step "3/4 the other seeds at each arm's lr (best validation EM at step $STEPS on seed $FIRST_SEED)"
for arm in $ARMS; do
    lr=$("$PY" examples/searchr1/distill_compare_summary.py --out "$OUT" --steps "$STEPS" --best-lr "$arm" --seed "$FIRST_SEED")
    for seed in $SEEDS; do [ "$seed" = "$FIRST_SEED" ] || run_arm "$arm" "$lr" "$seed"; done
done

step "4/4 table and curves"
# The demo's own held-out evaluation of its trained model is the teacher's line, when that model is the teacher.
TEACHER_EVAL=()
if [ "$TEACHER" = "$DEMO/rl/checkpoints/global_step_30/hf_model" ] && [ -f "$DEMO/eval/after_rl/eval_results.json" ]; then
    TEACHER_EVAL=(--teacher-eval "$DEMO/eval/after_rl/eval_results.json")
fi
"$PY" examples/searchr1/distill_compare_summary.py --out "$OUT" --steps "$STEPS" --every "$EVERY" --seeds $SEEDS \
    ${TEACHER_EVAL[@]+"${TEACHER_EVAL[@]}"}
