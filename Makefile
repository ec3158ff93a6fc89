# multinode.deepspeed: the two commands of the README, and their parts.
#   make demo   set up, start the local cluster, provision it, train across two workers
#   make test   unit tests, lint, sanity, end-to-end on the local cluster (the full check; CI runs it)
#   make test-fast  the inner loop: unit tests and the quality gates (lint and sanity beside them), no cluster
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
WORKERS ?= 2
# A comma inside $(or ...) separates its arguments: defaults that are lists use this.
comma := ,

.PHONY: setup cluster cluster-down site train demo test test-fast unit lint sanity e2e build clean bench-launch bench-slurm bench-recovery bench-site bench-scale bench-floor bench-workdir docs

setup:
	@scripts/setup

cluster: setup
	@$(BIN)/python scripts/localcluster.py up --workers $(WORKERS)

cluster-down:
	@python3 scripts/localcluster.py down

site: cluster
	$(BIN)/ansible-playbook site.yml

train:
	$(BIN)/ansible-playbook train.yml -e model=llama-tiny

demo: site train

unit: setup
	$(BIN)/python -m pytest tests/unit

lint: setup
	@scripts/lint

sanity: setup
	@scripts/sanity

e2e: setup
	$(BIN)/python -m pytest tests/e2e

# The reference pages under docs/reference/, from the plugins' DOCUMENTATION/EXAMPLES/RETURN and the roles'
# argument specs (tests/quality/test_docs.py fails when they are stale).
docs: setup
	$(BIN)/python scripts/gen_docs.py

build: setup
	$(BIN)/ansible-galaxy collection build --force --output-path .cache/build

# scripts/test runs scripts/setup itself, and counts its seconds as the set-up phase.
test:
	@scripts/test

# The inner loop (a few minutes, no cluster): the unit tests and the quality gates, ansible-lint and ansible-test
# sanity in the background beside the unit tests (tests/quality/gates.py). The time by phase is in
# tests/output/test-phases.json.
test-fast: setup
	$(BIN)/python -m pytest tests/unit tests/quality -p no:cacheprovider -q

# Each bench-* target prints its figures and, when it ends well, keeps them in docs/benchmarks/<date>-<target>.md
# (and .json): scripts/cost/record.py runs the launch-cost script (scripts/cost/<x>.py).
RECORD = $(BIN)/python scripts/cost/record.py

# Launch overhead: bare deepspeed vs train.yml on the warm local cluster (ROUNDS=5 by default: three rounds are too few on this 2-core machine).
bench-slurm:
	$(RECORD) bench-slurm -- $(BIN)/python scripts/cost/launch.py --slurm --rounds $(or $(ROUNDS),5) --json tests/output/bench-launch-slurm.json

bench-launch:
	$(RECORD) bench-launch -- $(BIN)/python scripts/cost/launch.py --ssh-free --rounds $(or $(ROUNDS),5) --json tests/output/bench-launch.json

# What -e workdir adds to a launch whose content is on the cluster already (target: at most 1 s), 5 rounds.
bench-workdir:
	$(RECORD) bench-workdir -- $(BIN)/python scripts/cost/workdir.py --rounds $(or $(ROUNDS),5) --json tests/output/bench-workdir.json

# site.yml with nothing to change against the first site.yml on fresh nodes (SIZES: worker counts; remakes the cluster).
bench-site:
	$(RECORD) bench-site -- $(BIN)/python scripts/cost/site.py --sizes $(or $(SIZES),2$(comma)8) --rounds $(or $(ROUNDS),3) --json tests/output/bench-site.json

# Ansible's part of a launch and a no-op site.yml per node at 2, 4, 8 and 16 workers (remakes the cluster at each size).
bench-scale:
	$(RECORD) bench-scale -- $(BIN)/python scripts/cost/scale.py --sizes $(or $(SIZES),2$(comma)4$(comma)8$(comma)16) --rounds $(or $(ROUNDS),2) --steps $(or $(STEPS),5) $(if $(BACKEND),--backend $(BACKEND)) --json tests/output/bench-scale.json

# The least a launch costs as the cluster grows, with no Ansible: pdsh's start and a node read at SIZES node names over the workers.
bench-floor:
	$(RECORD) bench-floor -- $(BIN)/python scripts/cost/floor.py --sizes $(or $(SIZES),2$(comma)16) --rounds $(or $(ROUNDS),3) --json tests/output/bench-floor.json

# Faults in a run with restarts (a lost node, a killed rank, a hang, a grow-back, a spare): fault -> next first step, goodput and wall time against a clean run (3 rounds; CASES=spare runs one case).
bench-recovery:
	$(RECORD) bench-recovery -- $(BIN)/python scripts/cost/recovery.py --rounds $(or $(ROUNDS),3) --steps $(or $(STEPS),1200) $(if $(CASES),--cases $(CASES)) --json tests/output/bench-recovery.json
