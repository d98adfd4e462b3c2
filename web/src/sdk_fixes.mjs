// Two faults of ReliableChannel (@waku/sdk 0.0.36 on @waku/sds 0.0.8), mended from outside
// without changing what goes on the wire. Both are tied to those versions: this file has
// no imports, so the test drivers of the same sdk (tests/interop/waku_light) use it too.

/**
 * ReliableChannel encodes each message twice: once for its retrieval hint and once to
 * send it. Each encoding stamps `new Date()` on a message without a timestamp, so if a
 * millisecond boundary falls between the two, the hint names a message nobody sent, and
 * members who ask the store by that hint get nothing. The first stamp is kept on the
 * message object that both encodings share.
 */
export function stampOnce(encoder) {
  const toProtoObj = encoder.toProtoObj.bind(encoder);
  encoder.toProtoObj = (message) => {
    message.timestamp ??= new Date();
    return toProtoObj(message);
  };
  return encoder;
}

/**
 * ReliableChannel resends a message by wrapping its payload again. While the message waits
 * in @waku/sds's outgoing buffer, that resends the same message. But a resend queued before
 * the acknowledgement that empties the buffer makes a new message under the same id with
 * a newer Lamport timestamp, and members that got different copies order their logs
 * differently. Here a payload that is already in the local history and no longer waiting
 * is never wrapped again. `messageIdOf(payload)` is the channel's id function.
 */
export function wrapOnce(messageChannel, messageIdOf) {
  const wrap = messageChannel._pushOutgoingMessage.bind(messageChannel);
  messageChannel._pushOutgoingMessage = async (payload, callback) => {
    const messageId = messageIdOf(payload);
    const waiting = messageChannel.outgoingBuffer.some((m) => m.messageId === messageId);
    if (!waiting && messageChannel.localHistory.some((m) => m.messageId === messageId)) return;
    return wrap(payload, callback);
  };
}

/**
 * ReliableChannel's missing-message retriever asks the store for every hash it lacks in
 * one query, and a failed query escapes as an unhandled rejection. A store bounds the
 * hashes of one query (config.json's `max_hashes_per_query`: 100 for sdsync, as for the
 * page size), so a page that lacks more would never get any of them. Here the hashes go
 * in queries of at most `maxHashes`, each with the options `moreOptions()` gives. A failed
 * query goes to `onError` and ends this round; the retriever asks again on its next.
 */
export function retrieveInChunks(retriever, maxHashes, moreOptions, onError) {
  const retrieve = retriever._retrieve;
  retriever._retrieve = async function* chunked(decoders, options) {
    const hashes = options.messageHashes ?? [];
    try {
      for (let start = 0; start < hashes.length; start += maxHashes) {
        const part = hashes.slice(start, start + maxHashes);
        yield* retrieve(decoders, { ...options, ...moreOptions(), messageHashes: part });
      }
    } catch (err) {
      onError(err);
    }
  };
}
