// NDJSON framing: one JSON text per line. The decoder buffers partial lines across chunks and caps
// a line's length, so a peer that never sends a newline cannot make the client buffer without
// bound.

export class FrameTooLong extends Error {
  override name = "FrameTooLong";
}

export function encodeFrame(message: unknown): string {
  // JSON.stringify escapes newlines inside strings, so a frame never holds a raw newline.
  return JSON.stringify(message) + "\n";
}

export class LineDecoder {
  private parts: Buffer[] = [];
  private size = 0;

  constructor(private readonly maxBytes: number) {}

  /** The complete lines in `chunk` (with what was buffered before it), without their newline. */
  push(chunk: Buffer): string[] {
    const lines: string[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl === -1) break;
      const piece = chunk.subarray(start, nl);
      if (this.size + piece.length > this.maxBytes) throw new FrameTooLong(`a frame exceeds ${this.maxBytes} bytes`);
      const line = this.parts.length === 0 ? piece : Buffer.concat([...this.parts, piece]);
      this.parts = [];
      this.size = 0;
      // Decode whole lines only: a multi-byte character split across chunks stays intact.
      const text = line.toString("utf8");
      if (text.trim() !== "") lines.push(text);
      start = nl + 1;
    }
    const rest = chunk.subarray(start);
    if (rest.length > 0) {
      if (this.size + rest.length > this.maxBytes) throw new FrameTooLong(`a frame exceeds ${this.maxBytes} bytes`);
      // Copy: the socket may reuse the chunk's memory.
      this.parts.push(Buffer.from(rest));
      this.size += rest.length;
    }
    return lines;
  }
}
