#!/usr/bin/env bash
# Issue 47's rows on one host of 4 GPUs (docs/benchmarks.md section 8), one group per call of under 10 minutes;
# rows are compared only within one group (each group that compares runs its baseline itself).
#
#   bash bench/four_gpu_rows.sh GROUP OUTDIR COMMIT
#
# GROUP: equivalence (every 4-GPU layout against one process, NCCL), xl (pretrain_xl N=1 and N=4, then N=4 with
# symmetric-memory buckets), 7b (pretrain_7b N=4, profiled; then with symmetric-memory FSDP2 buffers), 74k (DiT-7B
# at 73,728 tokens on CP4 all-to-all: the recipe's memory budget, then head groups of 2), stdit (ST-DiT-XL hybrid
# and ring CP4), wan480 / wan720 (finetune_wan_14b at 480p / 720p x 81 frames, random weights, mock data; 720p with
# full recompute, as its row in docs/benchmarks.md ran). Every row runs the user's command (bench/scaling.py ->
# torchrun launchers/train.py) and writes its JSON to OUTDIR. PYTHON names the interpreter (default python3, the one that
# holds PyTorch on the GPU machines).
set -euo pipefail
group=${1:?group: equivalence, xl, 7b, 74k, stdit, wan480 or wan720}
out=${2:?output folder}
commit=${3:?commit}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off

row() {  # row NAME ARGS...: one bench/scaling.py run into OUTDIR/NAME_4xh200_COMMIT.json
    local name=$1
    shift
    "${PYTHON:-python3}" bench/scaling.py --commit "$commit" --plot "/tmp/$name.png" "$@" --out "$out/${name}_4xh200_$commit.json"
}

latent74k=(--set data.num_frames=72 --set data.height=64 --set data.width=64)
wan=(--factory finetune_wan_14b --nprocs 4 --every 1 --skip 2 --set model.pretrained=None --set data=mock
     --set data.num_frames=21 --set data.context_length=512)
case $group in
equivalence)
    OUT=$out torchrun --standalone --nproc-per-node 4 bench/parallel_equivalence.py ;;
xl)
    row scaling_xl_n1n4 --factory pretrain_xl --nprocs 1,4 --steps 30 --every 5 --skip 2 --timeout 240
    row scaling_xl_n4_symmetric --factory pretrain_xl --nprocs 4 --steps 30 --every 5 --skip 2 --timeout 200 \
        --set trainer.strategy.comm_buffers=symmetric ;;
7b)
    row scaling_7b_n4 --factory pretrain_7b --nprocs 4 --steps 12 --every 4 --skip 1 --profile 2 --timeout 280
    row scaling_7b_n4_symmetric --factory pretrain_7b --nprocs 4 --steps 12 --every 4 --skip 1 --timeout 260 \
        --set trainer.strategy.comm_buffers=symmetric ;;
74k)
    cp4=(--factory pretrain_7b --nprocs 4 --steps 6 --every 2 --skip 1 "${latent74k[@]}"
         --set trainer.strategy.context_parallel_size=4 --set trainer.strategy.context_parallel_kind=a2a)
    row scaling_7b_74k_cp4_budget "${cp4[@]}" --timeout 280
    row scaling_7b_74k_cp4_budget_chunks2 "${cp4[@]}" --timeout 280 \
        --set trainer.strategy.context_parallel_a2a_chunks=2 ;;
stdit)
    for kind in hybrid ring; do
        row "scaling_stdit_cp4_$kind" --factory pretrain_stdit_xl --nprocs 4 --steps 8 --every 2 --skip 1 \
            --timeout 260 "${latent74k[@]}" --set trainer.strategy.context_parallel_size=4 \
            --set trainer.strategy.activation_checkpointing=none \
            --set trainer.strategy.factorized_context_parallel=$kind
    done ;;
wan480)
    row scaling_wan14b_ft_480p "${wan[@]}" --steps 5 --timeout 540 --set data.height=60 --set data.width=104 ;;
wan720)
    row scaling_wan14b_ft_720p "${wan[@]}" --steps 4 --timeout 540 --set data.height=90 --set data.width=160 \
        --set trainer.strategy.activation_checkpointing=full ;;
*)
    echo "unknown group $group: equivalence, xl, 7b, 74k, stdit, wan480 or wan720" >&2
    exit 2 ;;
esac
