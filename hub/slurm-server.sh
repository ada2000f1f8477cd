#!/bin/bash
# One user's notebook server on the course hub, as a Slurm job on the GPU partition.
# batchspawner's SlurmSpawner fills in the double-braced fields (hub/jupyterhub_config.py, from hub/site.toml)
# and submits this script as the user; the server reports its port to the hub when it starts.
#SBATCH --job-name=course-hub-{{username}}
#SBATCH --output={{homedir}}/.course-hub-server-%j.log
#SBATCH --chdir={{workdir}}
#SBATCH --export={{keepvars}}
{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if account %}#SBATCH --account={{account}}
{% endif %}{% for line in sbatch_args %}#SBATCH {{line}}
{% endfor %}
set -euo pipefail
export HOME={{homedir}} USER={{username}}
trap 'echo "course hub: the server was stopped (from the hub, or at its time limit)"' TERM
{{prologue}}
echo "course hub: {{username}}'s server on $(hostname), Slurm job ${SLURM_JOB_ID}, GPU(s) ${CUDA_VISIBLE_DEVICES:-none}, in {{workdir}}"
{% if srun %}{{srun}} {% endif %}{{cmd}}
