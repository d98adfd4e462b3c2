// web/src/mends.mjs on real ReliableChannels of one folder's @waku/sdk, over a fake node
// that records what would go on the wire: test_mends.py runs it for the page's folder
// (web/) and for the interop driver's (tests/interop/waku_light/), and compares.
//
// The caller imports the folder's packages (a bare import resolves from the folder the
// process runs in) and passes them to check(), which prints one JSON object: each mend's
// report and what each mend was seen to do. Timers of the channels are long or off, so
// everything here happens because this script made it happen.

import { MENDS, WRITTEN_FOR, mendReliableChannel } from "../../web/src/mends.mjs";

const CHANNEL = "mends";
const TOPIC = `/sds/1/${CHANNEL}/proto`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const text = (bytes) => new TextDecoder().decode(bytes);
const hex = (bytes) => Buffer.from(bytes).toString("hex");

/** A light node's three clients, as ReliableChannel calls them, recording every call. */
function fakeNode() {
  const node = {
    sent: [], // {proto, pubsubTopic} of each LightPush
    queries: [], // the options of each store query
    filterCalls: [],
    failQueries: false,
    lightPush: {
      async send(encoder, message) {
        // Encoding a few milliseconds after the channel did: without stamp-once, the
        // message sent would carry another timestamp than its retrieval hint names.
        await sleep(3);
        node.sent.push({ proto: await encoder.toProtoObj(message), pubsubTopic: encoder.pubsubTopic });
        return { successes: ["service"], failures: [] };
      },
    },
    filter: {
      async subscribe(decoder) {
        node.filterCalls.push(`subscribe ${decoder.contentTopic}`);
        return true;
      },
      async unsubscribe(decoder) {
        node.filterCalls.push(`unsubscribe ${decoder.contentTopic}`);
        return true;
      },
    },
    store: {
      async *queryGenerator(decoders, options) {
        node.queries.push({ hashes: options.messageHashes.length, peerId: options.peerId });
        if (node.failQueries) throw new Error("the store is down");
        yield [];
      },
    },
  };
  return node;
}

export async function check({ sdk, sds, versions }) {
  const routingInfo = sdk.utils.createRoutingInfo({ clusterId: 1, numShardsInCluster: 8 }, { contentTopic: TOPIC });
  const retrieveErrors = [];

  async function create(sender, node) {
    return sdk.ReliableChannel.create(
      node,
      CHANNEL,
      sender,
      sdk.createEncoder({ contentTopic: TOPIC, routingInfo }),
      sdk.createDecoder(TOPIC, routingInfo),
      { autoStart: false, syncMinIntervalMs: 0, retrieveFrequencyMs: 0, processTaskMinElapseMs: 10 }
    );
  }

  function mend(channel, more = {}) {
    return mendReliableChannel(channel, {
      versions,
      maxHashesPerQuery: 100,
      queryOptions: () => ({ peerId: "service" }),
      onRetrieveError: (err) => retrieveErrors.push(err.message),
      resendMs: 60_000,
      ...more,
    });
  }

  async function sendAndWait(mended, node, payload) {
    const before = node.sent.length;
    mended.channel.send(new TextEncoder().encode(payload));
    for (let i = 0; i < 200 && node.sent.length === before; i++) await sleep(5);
  }

  const hashOf = ({ proto, pubsubTopic }) => sdk.waku.messageHash(pubsubTopic, proto);
  // A sent message as the Filter or store client would hand it to the channel.
  const received = (sent) => {
    const hash = hashOf(sent);
    return { ...sent.proto, pubsubTopic: sent.pubsubTopic, hash, hashStr: hex(hash) };
  };
  const contentOf = (sent) => sds.Message.decode(sent.proto.payload)?.content;

  const nodeA = fakeNode();
  const alice = mend(await create("alice", nodeA));
  const started = await alice.subscribeAfresh();
  const resubscribed = await alice.subscribeAfresh();

  // stamp-once: the hint in alice's log names the message LightPush carried.
  await sendAndWait(alice, nodeA, "hi");
  const [hi] = nodeA.sent;
  const hintNamesSent = hex(alice.history()[0].retrievalHint) === hex(hashOf(hi));

  // process-now: bob's log holds alice's message as soon as processNow returns.
  const nodeB = fakeNode();
  const bob = mend(await create("bob", nodeB));
  await bob.subscribeAfresh();
  await bob.processNow([received(hi)]);
  const bobLogAtOnce = bob.history().map((m) => text(m.content));

  // wrap-once: bob's answer names "hi", which settles it for alice; sent again, it is
  // not wrapped anew (a new Lamport timestamp under the same id).
  await sendAndWait(bob, nodeB, "yo");
  const [yo] = nodeB.sent;
  await alice.processNow([received(yo)]);
  await sendAndWait(alice, nodeA, "hi");
  await sleep(50);
  const hiWrapped = nodeA.sent.filter((s) => contentOf(s) && text(contentOf(s)) === "hi").length;

  // restore-own: alice on another visit takes back her own message, once, and only hers.
  const alice2 = mend(await create("alice", fakeNode()));
  const restored = [
    alice2.restoreOwn(sds.Message.decode(hi.proto.payload), hashOf(hi)),
    alice2.restoreOwn(sds.Message.decode(hi.proto.payload), hashOf(hi)),
    alice2.restoreOwn(sds.Message.decode(yo.proto.payload), hashOf(yo)),
  ];
  const restoredLog = alice2.history().map((m) => [m.senderId, text(m.content), hex(m.retrievalHint)]);

  // retrieve-in-chunks: 250 missing hashes go in queries of 100, to the service peer; a
  // failed query reaches onRetrieveError instead of escaping.
  const retriever = alice.channel.missingMessageRetriever;
  for (let i = 0; i < 250; i++) retriever.addMissingMessage(`missing-${i}`, new Uint8Array([i % 256, i >> 8]));
  await retriever.retrieveMissingMessage();
  const chunks = nodeA.queries.splice(0);
  nodeA.failQueries = true;
  await retriever.retrieveMissingMessage();

  // Other versions: a warning; a channel without a member a mend needs: that mend skipped.
  const elsewhere = mend(await create("carol", fakeNode()), {
    versions: { ...WRITTEN_FOR, "@waku/sdk": "0.0.99" },
  });
  const lacking = await create("dave", fakeNode());
  delete lacking.messageChannel.timeReceived;
  const partial = mend(lacking);
  let partialError;
  try {
    partial.restoreOwn(sds.Message.decode(hi.proto.payload), hashOf(hi));
  } catch (err) {
    partialError = err.message;
  }

  return {
    mends: MENDS,
    report: alice.report,
    started,
    resubscribed,
    filter_calls: nodeA.filterCalls,
    resends_installed: alice.channel.retryManager === alice.resends,
    hint_names_sent: hintNamesSent,
    bob_log_at_once: bobLogAtOnce,
    hi_wrapped: hiWrapped,
    restored,
    restored_log: restoredLog,
    hi_hash: hex(hashOf(hi)),
    chunks,
    retrieve_errors: retrieveErrors,
    other_versions: elsewhere.report,
    lacking: { report: partial.report, error: partialError },
  };
}
