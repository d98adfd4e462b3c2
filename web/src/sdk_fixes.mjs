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
