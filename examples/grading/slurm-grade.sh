#!/usr/bin/env bash
# Autograde a class on a Slurm cluster: one array task per shard of the students, then one
# job that merges the shards. Submit from the repository's folder, on a filesystem every node
# shares (the course folder and the submissions must be visible to all tasks):
#
#   jobid=$(sbatch --parsable --array=0-3 examples/grading/slurm-grade.sh path/to/submissions)
#   sbatch --dependency=afterok:$jobid --wrap "make grade-merge"
#
# Each task grades the students of its shard (SHARD=<task>/<tasks>) with half its cores as
# JOBS, each notebook sandboxed; nothing is written outside build/course/shards/<i>-of-<m>/.
#SBATCH --job-name=grade
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
set -euo pipefail
submissions=${1:?give the submissions folder: one sub-folder per student}
tasks=${SLURM_ARRAY_TASK_COUNT:?run me as a Slurm array job: sbatch --array=0-3 $0 $submissions}
cores=${SLURM_CPUS_PER_TASK:-2}
# SHARD=m alone: the grader reads this task's index from SLURM_ARRAY_TASK_ID
exec make grade SUBMISSIONS="$submissions" SHARD="$tasks" JOBS=$(( cores > 1 ? cores / 2 : 1 )) \
  ${COURSE:+COURSE="$COURSE"}
