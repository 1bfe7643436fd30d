// Writes a gzip and a brotli copy beside every compressible file of a build, so the server sends
// them as they are instead of compressing on every request. The output depends on the input
// alone (gzip's header carries no time or name here), which keeps the committed bundle
// reproducible byte for byte.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';

const COMPRESSIBLE = /\.(html|js|css|svg|json|ttf|txt|map)$/;
// A copy that saves less than this is not worth the bytes it adds to the binary.
const MIN_SAVING = 0.1;

function* files(dir) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* files(path);
    else yield path;
  }
}

const root = process.argv[2] ?? 'dist';
let written = 0;
for (const path of [...files(root)].sort()) {
  if (!COMPRESSIBLE.test(path)) continue;
  const raw = readFileSync(path);
  const copies = {
    gz: gzipSync(raw, { level: 9 }),
    br: brotliCompressSync(raw, {
      params: {
        [constants.BROTLI_PARAM_QUALITY]: constants.BROTLI_MAX_QUALITY,
        [constants.BROTLI_PARAM_SIZE_HINT]: raw.length,
      },
    }),
  };
  for (const [extension, body] of Object.entries(copies)) {
    if (body.length > raw.length * (1 - MIN_SAVING)) continue;
    writeFileSync(`${path}.${extension}`, body);
    written += 1;
  }
}
console.log(`compress: wrote ${written} precompressed copies in ${root}`);
