"""Budgets keyed by what an attacker cannot mint (issue 38): the identities seen from one
address share that address's bucket, each inside its own; IPv6 addresses of one /64 are
one address; nothing is spent when either bucket refuses. The store-query answer budget
is held per address the same way."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdsync.waku.ratelimit import PeerBuckets, RateLimit, address_key
from sdsync.waku.store.model import StatusCode
from sdsync.waku.store.service import AnswerBudget, AnswerLimits

PEER = RateLimit(10, 10.0)  # 10 at once, 1 a second
ADDRESS = RateLimit(20, 10.0)  # 20 at once, 2 a second


def test_fresh_identities_from_one_address_share_its_budget() -> None:
    buckets = PeerBuckets(PEER, per_address=ADDRESS)
    taken = sum(buckets.take(f"peer-{i}", 0.0, address="127.0.0.2") for i in range(100))
    assert taken == 20  # not 100 × 10: a new key per refusal buys nothing
    assert buckets.refusal("peer-new", 0.0, address="127.0.0.2") == "address"
    assert buckets.take("honest", 0.0, address="127.0.0.3")  # another address is untouched
    assert buckets.wait_s("peer-new", 0.0, address="127.0.0.2") == 0.5


def test_one_peer_is_held_to_its_share_inside_its_address() -> None:
    buckets = PeerBuckets(PEER, per_address=ADDRESS)
    assert sum(buckets.take("alone", 0.0, address="10.0.0.1") for _ in range(30)) == 10
    assert buckets.refusal("alone", 0.0, address="10.0.0.1") == "peer"
    assert buckets.take("neighbour", 0.0, address="10.0.0.1")  # its address has 10 left


def test_a_refusal_spends_nothing_from_either_bucket() -> None:
    buckets = PeerBuckets(PEER, per_address=ADDRESS)
    for i in range(2):
        assert buckets.take(f"p{i}", 0.0, 10.0, address="10.0.0.1")
    assert buckets.refusal("p2", 0.0, 5.0, address="10.0.0.1") == "address"
    assert buckets.take("p2", 0.0, 10.0, address="10.0.0.2")  # p2's own bucket still full


def test_ipv6_addresses_of_one_64_are_one_address() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:ffff::9")
    assert address_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:127.0.0.2") == "127.0.0.2"
    assert address_key("127.0.0.2") == "127.0.0.2"
    buckets = PeerBuckets(PEER, per_address=ADDRESS)
    spent = sum(buckets.take(f"p{i}", 0.0, address=f"2001:db8::{i:x}") for i in range(50))
    assert spent == 20


def test_without_an_address_only_the_peer_is_counted() -> None:
    buckets = PeerBuckets(PEER, per_address=ADDRESS)
    assert sum(buckets.take(f"p{i}", 0.0) for i in range(30)) == 30


def test_the_address_table_is_bounded_as_the_peer_table_is() -> None:
    buckets = PeerBuckets(PEER, per_address=ADDRESS, max_peers=4)
    assert all(buckets.take("p", 0.0, address=f"10.0.0.{i}") for i in range(1, 5))
    # Four addresses, each with a spent token: no room for a fifth until one refills.
    assert buckets.refusal("q", 0.1, address="10.0.0.9") == "table"
    assert buckets.take("q", 20.0, address="10.0.0.9")  # they have refilled: forgotten


@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),  # peer
            st.sampled_from(["10.0.0.1", "10.0.0.2", "2001:db8::1", "2001:db8::2"]),
            st.floats(0.0, 0.5),  # time step
            st.floats(0.5, 12.0),  # cost
        ),
        max_size=300,
    )
)
def test_no_address_spends_more_than_its_bucket_allows(
    steps: list[tuple[int, str, float, float]],
) -> None:
    buckets = PeerBuckets(PEER, per_address=ADDRESS)
    now = 0.0
    spent: dict[str, float] = {}
    for peer, address, step, cost in steps:
        now += step
        if buckets.take(str(peer), now, cost, address=address):
            spent[address_key(address)] = spent.get(address_key(address), 0.0) + cost
    # A bucket may go into debt by one oversized cost, never further.
    bound = ADDRESS.volume + ADDRESS.per_s * now + 12.0
    assert all(total <= bound for total in spent.values()), spent


def test_store_answers_from_one_address_share_its_byte_budget() -> None:
    limits = AnswerLimits(per_peer_bytes=10, per_ip_bytes=15, total_bytes=1000, hold_s=10.0)
    budget = AnswerBudget(limits, clock=lambda: 0.0)
    assert budget.charge("p1", 10, "10.0.0.1") is None
    assert budget.charge("p2", 10, "10.0.0.1") == (StatusCode.TOO_MANY_REQUESTS, "answer_budget_ip")
    assert budget.charge("p2", 5, "10.0.0.1") is None  # what the address has left
    assert budget.charge("p1", 1, "10.0.0.2") == (
        StatusCode.TOO_MANY_REQUESTS,
        "answer_budget_peer",
    )
    assert budget.charge("p3", 10, "10.0.0.2") is None  # another address is untouched
