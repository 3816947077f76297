#!/bin/bash
# A model zoo on a Slurm cluster: one array task per shard, all into one root.
#
#   sbatch docs/recipes/slurm-array.sh                      # ROOT and MANIFEST below
#   ROOT=s3://my-bucket/zoo sbatch --export=ALL docs/recipes/slurm-array.sh
#
# Each task's shard comes from SLURM_ARRAY_TASK_ID (counted from
# SLURM_ARRAY_TASK_MIN) and SLURM_ARRAY_TASK_COUNT: change --array, nothing
# else. --requeue and --resume make a preempted or failed task's rerun
# redo only what it had not finished. The last task to finish writes
# ROOT/batch.json and exits with the whole zoo's code (0 passed, 3 gate, 1 errors).
#
#SBATCH --job-name=mpconvert-zoo
#SBATCH --array=0-1
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=mpconvert-zoo-%A_%a.log
set -euo pipefail

MANIFEST="${MANIFEST:-zoo.toml}"
# A folder every node sees (NFS, Lustre), or a bucket (pip install mpconvert[s3];
# credentials from the environment or ~/.aws, as the AWS tools read them).
ROOT="${ROOT:-/shared/mpconvert-zoo}"

# exec: scancel and preemption signal mpconvert itself, which stops its workers.
exec mpconvert batch "$MANIFEST" --out "$ROOT" --shard auto --resume
