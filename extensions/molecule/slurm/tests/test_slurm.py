"""The slurm role's cluster, asked through Slurm's own commands on the coordinator."""
import time

COORD = "mndsm-sl-coord"
WORKERS = ["mndsm-sl-w1", "mndsm-sl-w2"]
testinfra_hosts = ["podman://%s" % name for name in [COORD] + WORKERS]


def on(host, name):
    return host.get_host("podman://%s" % name)


def test_sinfo_shows_both_workers_idle_in_the_partition(host):
    out = on(host, COORD).check_output("sinfo -h -N -o '%N|%P|%T'")
    assert sorted(out.splitlines()) == ["mndsm-sl-w1|gpu*|idle", "mndsm-sl-w2|gpu*|idle"]


def test_srun_runs_on_both_workers_and_sacct_keeps_the_job(host):
    coord = on(host, COORD)
    out = coord.check_output("srun -N2 --partition=gpu --job-name=molecule-hostname hostname")
    assert sorted(out.split()) == WORKERS
    for _try in range(20):
        rows = coord.check_output("sacct -n -P -X --name=molecule-hostname -o JobName,State,ExitCode,NodeList")
        if "COMPLETED" in rows:
            break
        time.sleep(1)
    assert "molecule-hostname|COMPLETED|0:0|mndsm-sl-w[1-2]" in rows.splitlines(), rows


def test_one_munge_key_mode_0400_owned_by_munge(host):
    sums = set()
    for name in [COORD] + WORKERS:
        key = on(host, name).file("/etc/munge/munge.key")
        assert key.exists and key.user == "munge" and key.mode == 0o400, name
        sums.add(on(host, name).check_output("sha256sum /etc/munge/munge.key").split()[0])
    assert len(sums) == 1


def test_a_credential_made_on_the_coordinator_decodes_on_every_worker(host):
    cred = on(host, COORD).check_output("munge -n")
    for name in WORKERS:
        assert on(host, name).run("echo %s | unmunge" % cred).rc == 0, name


def test_daemons_run_where_they_belong(host):
    assert on(host, COORD).process.filter(comm="slurmctld")
    assert on(host, COORD).process.filter(comm="slurmdbd")
    for name in WORKERS:
        assert on(host, name).process.filter(comm="slurmd"), name
        assert not on(host, name).process.filter(comm="slurmctld"), name
