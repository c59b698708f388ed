// Audio files built in test code, of a known duration, for billing by the upload's own length.
// WAV is written by hand (a 44-byte RIFF header and PCM samples).

/** A mono PCM WAV of `seconds` (8 kHz, 8-bit by default: 8,000 bytes a second, a quarter of the 32,000 a byte rate would assume). */
export function wavFile(seconds: number, sampleRate = 8000, bitsPerSample = 8): Buffer {
  const bytesPerSample = bitsPerSample / 8;
  const dataBytes = Math.round(seconds * sampleRate) * bytesPerSample;
  const buf = Buffer.alloc(44 + dataBytes, bitsPerSample === 8 ? 128 : 0);
  buf.write('RIFF', 0, 'latin1');
  buf.writeUInt32LE(36 + dataBytes, 4);
  buf.write('WAVE', 8, 'latin1');
  buf.write('fmt ', 12, 'latin1');
  buf.writeUInt32LE(16, 16);
  buf.writeUInt16LE(1, 20); // PCM
  buf.writeUInt16LE(1, 22); // mono
  buf.writeUInt32LE(sampleRate, 24);
  buf.writeUInt32LE(sampleRate * bytesPerSample, 28);
  buf.writeUInt16LE(bytesPerSample, 32);
  buf.writeUInt16LE(bitsPerSample, 34);
  buf.write('data', 36, 'latin1');
  buf.writeUInt32LE(dataBytes, 40);
  return buf;
}
