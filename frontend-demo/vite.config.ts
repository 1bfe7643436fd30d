import { resolve } from 'node:path';
import { defineConfig } from 'vite';

// Two pages: the demo app at / and GraphiQL, which `pulse serve` answers at GET /graphql for a
// browser. Both are built into dist/, which the binary embeds; every asset name carries its
// content hash, so the server can let browsers keep them for a year.
export default defineConfig({
  build: {
    rollupOptions: {
      input: {
        app: resolve(import.meta.dirname, 'index.html'),
        graphiql: resolve(import.meta.dirname, 'graphiql.html'),
      },
      // GraphiQL's dependencies mark modules "use client" for React Server Components, which
      // mean nothing in a browser bundle.
      onwarn(warning, warn) {
        if (warning.code !== 'MODULE_LEVEL_DIRECTIVE') warn(warning);
      },
    },
    // Monaco's languages and workers are large by nature; the server sends them compressed.
    chunkSizeWarningLimit: 4096,
    reportCompressedSize: false,
  },
  oxc: {
    jsx: { runtime: 'automatic', importSource: 'preact' },
  },
  server: {
    // `npm run dev` against a `pulse serve` on the default address.
    proxy: { '/graphql': { target: 'http://127.0.0.1:8080', ws: true } },
  },
});
