"""Archive.topic_counts, the status page's archive table, on both backends."""

from __future__ import annotations

from storetest import PUBSUB, make_messages

from sdsync.store.archive import SqlArchive, TopicCount


def test_topic_counts_largest_first_with_oldest_and_newest(archive: SqlArchive) -> None:
    messages = make_messages(30, topics=("/a/1/x/proto", "/a/1/x/proto", "/b/1/y/proto"))
    archive.insert(messages)
    counts = archive.topic_counts(10)
    expected = []
    for topic in ("/a/1/x/proto", "/b/1/y/proto"):
        stamps = [m.timestamp for m in messages if m.message.content_topic == topic]
        expected.append(TopicCount(PUBSUB, topic, len(stamps), min(stamps), max(stamps)))
    assert counts == expected
    assert archive.topic_counts(1) == expected[:1]
