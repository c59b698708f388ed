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

/** An MPEG-1 Layer III stream (no Xing header) of `seconds`: 128 kbit/s, 44.1 kHz, frames of silence (417 bytes, 1,152 samples each). */
export function mp3File(seconds: number): Buffer {
  const frames = Math.round((seconds * 44100) / 1152);
  const frame = Buffer.alloc(417);
  // Sync, MPEG-1, Layer III, no CRC; 128 kbit/s (index 9), 44.1 kHz (index 0), no padding; mono.
  frame.writeUInt32BE(0xfffb90c0, 0);
  return Buffer.concat(new Array(frames).fill(frame));
}

/** FLAC: the `fLaC` marker and a STREAMINFO block saying `seconds` at 16 kHz mono 16-bit, then a frame's worth of bytes. */
export function flacFile(seconds: number, extraBytes = 4096): Buffer {
  const rate = 16000;
  const samples = BigInt(Math.round(seconds * rate));
  const info = Buffer.alloc(34);
  info.writeUInt16BE(4096, 0); // min block size
  info.writeUInt16BE(4096, 2); // max block size
  // Sample rate (20 bits), channels - 1 (3 bits), bits per sample - 1 (5 bits), total samples (36 bits).
  const packed = (BigInt(rate) << 44n) | (0n << 41n) | (15n << 36n) | samples;
  info.writeBigUInt64BE(packed, 10);
  const header = Buffer.from([0x80, 0, 0, 34]); // last metadata block, STREAMINFO, 34 bytes
  return Buffer.concat([Buffer.from('fLaC', 'latin1'), header, info, Buffer.alloc(extraBytes)]);
}

/** The Ogg page checksum (CRC-32, polynomial 0x04c11db7, not reflected). */
function oggCrc(page: Buffer): number {
  let crc = 0;
  for (const byte of page) {
    crc ^= byte << 24;
    for (let i = 0; i < 8; i++) crc = crc & 0x80000000 ? ((crc << 1) ^ 0x04c11db7) >>> 0 : (crc << 1) >>> 0;
  }
  return crc >>> 0;
}

function oggPage(headerType: number, granule: bigint, seq: number, packet: Buffer): Buffer {
  const segments: number[] = [];
  let left = packet.length;
  while (left >= 255) {
    segments.push(255);
    left -= 255;
  }
  segments.push(left);
  const page = Buffer.alloc(27 + segments.length + packet.length);
  page.write('OggS', 0, 'latin1');
  page[4] = 0;
  page[5] = headerType;
  page.writeBigUInt64LE(granule, 6);
  page.writeUInt32LE(0x7e11, 14); // serial
  page.writeUInt32LE(seq, 18);
  page[26] = segments.length;
  Buffer.from(segments).copy(page, 27);
  packet.copy(page, 27 + segments.length);
  page.writeUInt32LE(oggCrc(page), 22);
  return page;
}

/** Ogg/Opus: OpusHead, OpusTags, audio pages of `bytesPerPage`, and a last page whose granule position says `seconds` (48 kHz). */
export function oggOpusFile(seconds: number, audioPages = 4, bytesPerPage = 200): Buffer {
  const head = Buffer.alloc(19);
  head.write('OpusHead', 0, 'latin1');
  head[8] = 1; // version
  head[9] = 1; // channels
  head.writeUInt16LE(312, 10); // pre-skip
  head.writeUInt32LE(48000, 12); // input sample rate
  const tags = Buffer.concat([Buffer.from('OpusTags', 'latin1'), Buffer.from([4, 0, 0, 0]), Buffer.from('test', 'latin1'), Buffer.alloc(4)]);
  const pages = [oggPage(0x02, 0n, 0, head), oggPage(0, 0n, 1, tags)];
  const total = BigInt(Math.round(seconds * 48000) + 312);
  for (let i = 0; i < audioPages; i++) {
    const granule = (total * BigInt(i + 1)) / BigInt(audioPages);
    // A TOC byte (SILK narrow-band 20 ms, one frame) and padding.
    const packet = Buffer.alloc(bytesPerPage);
    packet[0] = 0x08;
    pages.push(oggPage(i === audioPages - 1 ? 0x04 : 0, granule, 2 + i, packet));
  }
  return Buffer.concat(pages);
}

function box(type: string, ...content: Buffer[]): Buffer {
  const body = Buffer.concat(content);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(8 + body.length, 0);
  head.write(type, 4, 'latin1');
  return Buffer.concat([head, body]);
}

/** M4A: ftyp, a moov whose mvhd says `seconds` (time scale 1000), and an mdat of `mdatBytes`. */
export function m4aFile(seconds: number, mdatBytes = 4096): Buffer {
  const ftyp = box('ftyp', Buffer.from('M4A ', 'latin1'), Buffer.alloc(4), Buffer.from('M4A mp42isom', 'latin1'));
  const mvhd = Buffer.alloc(100);
  mvhd.writeUInt32BE(1000, 12); // time scale
  mvhd.writeUInt32BE(Math.round(seconds * 1000), 16); // duration
  mvhd.writeUInt32BE(0x00010000, 20); // rate 1.0
  mvhd.writeUInt16BE(0x0100, 24); // volume 1.0
  mvhd.writeUInt32BE(2, 96); // next track id
  // One sound track whose media header says the same length (what the parser reads).
  const tkhd = Buffer.alloc(84);
  tkhd.writeUInt32BE(1, 12); // track id
  const mdhd = Buffer.alloc(24);
  mdhd.writeUInt32BE(16000, 12); // time scale: the sample rate
  mdhd.writeUInt32BE(Math.round(seconds * 16000), 16);
  const hdlr = Buffer.concat([Buffer.alloc(8), Buffer.from('soun', 'latin1'), Buffer.alloc(12), Buffer.from('sound\0', 'latin1')]);
  // An AAC sample description: mono, 16-bit, 16 kHz (16.16 fixed point).
  const entry = Buffer.alloc(28);
  entry.writeUInt16BE(1, 6); // data reference index
  entry.writeUInt16BE(1, 16); // channels
  entry.writeUInt16BE(16, 18); // sample size
  entry.writeUInt32BE(16000 * 65536, 24);
  const stsdHead = Buffer.alloc(8);
  stsdHead.writeUInt32BE(1, 4); // one entry
  // Empty time-to-sample and sample-size tables (the media header gives the length).
  const stbl = box('stbl', box('stsd', stsdHead, box('mp4a', entry)), box('stts', Buffer.alloc(8)), box('stsz', Buffer.alloc(12)));
  const trak = box('trak', box('tkhd', tkhd), box('mdia', box('mdhd', mdhd), box('hdlr', hdlr), box('minf', stbl)));
  return Buffer.concat([ftyp, box('moov', box('mvhd', mvhd), trak), box('mdat', Buffer.alloc(mdatBytes))]);
}

/** An EBML element: id bytes, a size as an 8-byte vint, the data. */
function ebml(id: number[], ...content: Buffer[]): Buffer {
  const data = Buffer.concat(content);
  const size = Buffer.alloc(8);
  size.writeBigUInt64BE(BigInt(data.length) | (1n << 56n));
  return Buffer.concat([Buffer.from(id), size, data]);
}

function uint(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}

/** WebM: an EBML header (DocType webm) and a Segment whose Info says `seconds` (TimecodeScale 1 ms), then `clusterBytes` of a Void element. */
export function webmFile(seconds: number, clusterBytes = 4096): Buffer {
  const header = ebml([0x1a, 0x45, 0xdf, 0xa3], ebml([0x42, 0x86], Buffer.from([1])), ebml([0x42, 0x82], Buffer.from('webm', 'latin1')), ebml([0x42, 0x87], Buffer.from([4])), ebml([0x42, 0x85], Buffer.from([2])));
  const duration = Buffer.alloc(8);
  duration.writeDoubleBE(seconds * 1000);
  const info = ebml([0x15, 0x49, 0xa9, 0x66], ebml([0x2a, 0xd7, 0xb1], uint(1_000_000)), ebml([0x44, 0x89], duration));
  const filler = ebml([0xec], Buffer.alloc(clusterBytes));
  return Buffer.concat([header, ebml([0x18, 0x53, 0x80, 0x67], info, filler)]);
}
