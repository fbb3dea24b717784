"""The fair dispatch policy (pure) and its use through the API, a worker and the reconciler."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.jobs.dispatch import WaitingJob, dispatch_fairly, fair_order
from kernel.reconciler import reconcile_once
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key, upload
from worker.runner import JobRunner

waiting_jobs = st.lists(
    st.tuples(st.sampled_from("abcd"), st.sampled_from(["gpu", "cpu"]), st.booleans()), max_size=60
).map(
    lambda rows: [
        WaitingJob(id=f"j{i}", tenant_id=t, queue=q, created_at_order=i, sent=s) for i, (t, q, s) in enumerate(rows)
    ]
)


@settings(max_examples=300, deadline=None)
@given(jobs=waiting_jobs, per_tenant=st.integers(1, 5))
def test_the_policy_fills_free_slots_oldest_first_and_never_over_a_tenants_share(
    jobs: list[WaitingJob], per_tenant: int
) -> None:
    """Shares are per (tenant, queue): a tenant's GPU backlog never holds up its CPU jobs."""
    picked = fair_order(jobs, per_tenant=per_tenant)
    by_id = {job.id: job for job in jobs}

    def share(job: WaitingJob) -> tuple[str, str | None]:
        return job.tenant_id, job.queue

    assert len(set(picked)) == len(picked) and all(not by_id[j].sent for j in picked)
    in_broker = Counter(share(job) for job in jobs if job.sent)
    sent_now = Counter(share(by_id[j]) for j in picked)
    for key in {share(job) for job in jobs}:
        backlog = [job for job in jobs if share(job) == key and not job.sent]
        room = max(0, per_tenant - in_broker[key])
        # Work-conserving and capped: exactly min(room, backlog) of the share's jobs go now …
        assert sent_now[key] == min(room, len(backlog))
        # … and they are its oldest.
        mine = [j for j in picked if share(by_id[j]) == key]
        assert mine == [job.id for job in backlog[: len(mine)]]
    # Round robin: each pick goes to a share with no more jobs in the broker than any other share
    # that could also take one at that moment.
    counts = Counter(in_broker)
    remaining = Counter(share(job) for job in jobs if not job.sent)
    for job_id in picked:
        key = share(by_id[job_id])
        eligible = [k for k in remaining if remaining[k] > 0 and counts[k] < per_tenant]
        assert all(counts[key] <= counts[k] for k in eligible)
        counts[key] += 1
        remaining[key] -= 1


def test_another_tenants_first_job_does_not_wait_behind_a_backlog(tmp_path: Path, digits_csv: bytes) -> None:
    settings_ = make_settings(tmp_path / "data", dispatch_per_tenant=2)
    migrate(settings_)
    database = Database(settings_.resolved_database_url)
    dispatcher = RecordingDispatcher()
    with TestClient(create_app(settings_, dispatcher=dispatcher)) as client:
        alice = {"Authorization": f"Bearer {new_key(database, 'alice')}"}
        bob = {"Authorization": f"Bearer {new_key(database, 'bob')}"}
        client.headers.update(alice)
        alices = upload(client, digits_csv).json()["id"]
        queued = []
        for _ in range(6):
            spec = dp_sgd_spec(alices)
            spec["training"] = {"steps": 2, "batch_size": 32, "learning_rate": 0.1}
            queued.append(client.post("/v1/jobs", json=spec).json()["id"])
        assert dispatcher.sent == queued[:2]  # two of alice's wait in the broker, four in the database
        client.headers.update(bob)
        bobs = upload(client, digits_csv, name="bob-digits").json()["id"]
        first = client.post("/v1/jobs", json=dp_sgd_spec(bobs)).json()["id"]
        assert dispatcher.sent == [*queued[:2], first]  # bob's first job goes straight in
        # A worker takes alice's first job: her next one is sent, and only it.
        assert JobRunner(settings_, db=database, dispatcher=dispatcher).run(queued[0]) == "succeeded"
        assert dispatcher.sent == [*queued[:2], first, queued[2]]
        # The reconciler sends nothing more while the broker holds each tenant's share.
        assert reconcile_once(database, settings_, dispatcher).redispatched == ()
        assert dispatch_fairly(database, dispatcher, per_tenant=2, per_tuning=4) == []
    database.dispose()


grouped_work = st.lists(
    st.tuples(st.sampled_from("ab"), st.sampled_from([None, "t1", "t2"]), st.booleans()), max_size=40
).map(
    lambda rows: [
        WaitingJob(id=f"u{i}", tenant_id=t, queue="gpu", created_at_order=i, sent=s, group=g and f"{t}{g}")
        for i, (t, g, s) in enumerate(rows)
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    units=grouped_work,
    per_tenant=st.integers(1, 5),
    per_group=st.integers(1, 3),
    running=st.dictionaries(st.sampled_from(["at1", "at2", "bt1"]), st.integers(0, 3)),
)
def test_a_tunings_slots_share_their_tenants_turn_and_never_exceed_the_tunings_cap(
    units: list[WaitingJob], per_tenant: int, per_group: int, running: dict[str, int]
) -> None:
    """Slots (units with a group) are units of their tenant's share like jobs; a group never has
    more than ``per_group`` out (sent or running); and a slot that cannot go never blocks the
    tenant's later jobs."""
    picked = fair_order(units, per_tenant=per_tenant, per_group=per_group, group_running=running)
    by_id = {unit.id: unit for unit in units}
    assert len(set(picked)) == len(picked) and all(not by_id[u].sent for u in picked)
    for tenant in "ab":
        in_broker = sum(1 for u in units if u.tenant_id == tenant and u.sent)
        assert in_broker + sum(1 for u in picked if by_id[u].tenant_id == tenant) <= max(per_tenant, in_broker)
    for group in ("at1", "at2", "bt1", "bt2"):
        out = running.get(group, 0) + sum(1 for u in units if u.group == group and u.sent)
        sent_now = sum(1 for u in picked if by_id[u].group == group)
        assert sent_now <= max(0, per_group - out)
        mine = [u for u in picked if by_id[u].group == group]  # oldest first within the tuning
        waiting = [u.id for u in units if u.group == group and not u.sent]
        assert mine == waiting[: len(mine)]
    for tenant in "ab":  # work-conserving: a tenant with room and a sendable unit left sent it
        room = per_tenant - sum(1 for u in units if u.tenant_id == tenant and u.sent)
        sent_now = [u for u in picked if by_id[u].tenant_id == tenant]
        if len(sent_now) < room:
            left = [u for u in units if u.tenant_id == tenant and not u.sent and u.id not in picked]
            for unit in left:
                assert unit.group is not None  # only slots whose tuning is at its cap stay behind
                out = running.get(unit.group, 0) + sum(
                    1 for u in units if u.group == unit.group and (u.sent or u.id in picked)
                )
                assert out >= per_group
