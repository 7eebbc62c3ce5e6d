// Events arrive as the schema's envelope (`RawEvent`: any type, so a newer daemon's types pass
// through); `isEvent` narrows one to a known type with its typed `data`.

import type { EventType, RawEvent, TypedEvent } from "./generated/protocol.js";

/** True when `event` is of `type`; narrows its `data` to that type's definition. */
export function isEvent<T extends EventType>(event: RawEvent, type: T): event is RawEvent & TypedEvent<T> {
  return event.type === type;
}
