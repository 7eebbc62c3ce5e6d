import assert from "node:assert/strict";
import { test } from "node:test";

import { FrameTooLong, LineDecoder, encodeFrame } from "../src/index.js";

test("lines split across chunks, a multi-byte character split in two, blank lines skipped", () => {
  const decoder = new LineDecoder(1024);
  const frame = Buffer.from(encodeFrame({ text: "é\nx" }) + "\n" + encodeFrame({ n: 2 }));
  const at = frame.indexOf(0xc3) + 1; // inside the two bytes of é
  assert.deepEqual(decoder.push(frame.subarray(0, at)), []);
  const lines = decoder.push(frame.subarray(at));
  assert.deepEqual(
    lines.map((l) => JSON.parse(l)),
    [{ text: "é\nx" }, { n: 2 }],
  );
});

test("a line over the cap is refused, whether in one chunk or many", () => {
  assert.throws(() => new LineDecoder(8).push(Buffer.from("0123456789\n")), FrameTooLong);
  const decoder = new LineDecoder(8);
  decoder.push(Buffer.from("01234"));
  assert.throws(() => decoder.push(Buffer.from("56789")), FrameTooLong);
  assert.deepEqual(new LineDecoder(8).push(Buffer.from("01234567\n")), ["01234567"]);
});
