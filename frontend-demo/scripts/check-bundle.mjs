// Rebuilds the bundle from source (with the installed, lockfile-pinned packages) into a temporary
// directory and compares it with the committed dist/, file by file and byte for byte; also checks
// that the typed schema (src/graphql-env.d.ts) matches ../schema.graphql. CI runs it after
// `npm ci`; a difference means someone changed the source without running `npm run build`.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';

function files(dir, root = dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    return entry.isDirectory() ? files(path, root) : [relative(root, path)];
  });
}

const scratch = mkdtempSync(join(tmpdir(), 'pulse-bundle-'));
const problems = [];
try {
  const typed = join(scratch, 'graphql-env.d.ts');
  execFileSync('npx', ['gql.tada', 'generate', 'output', '--output', typed], { stdio: 'inherit' });
  if (!readFileSync(typed).equals(readFileSync('src/graphql-env.d.ts'))) {
    problems.push('src/graphql-env.d.ts differs from ../schema.graphql: run `npm run schema`');
  }
  const built = join(scratch, 'dist');
  execFileSync('npx', ['tsc', '--noEmit'], { stdio: 'inherit' });
  execFileSync('npx', ['vite', 'build', '--outDir', built, '--emptyOutDir', '--logLevel', 'warn'], { stdio: 'inherit' });
  execFileSync('node', ['scripts/compress.mjs', built], { stdio: 'inherit' });
  const fresh = new Set(files(built));
  const committed = new Set(files('dist'));
  for (const name of [...new Set([...fresh, ...committed])].sort()) {
    if (!committed.has(name)) problems.push(`dist/${name} is missing (the build writes it)`);
    else if (!fresh.has(name)) problems.push(`dist/${name} is stale (the build no longer writes it)`);
    else if (!readFileSync(join(built, name)).equals(readFileSync(join('dist', name)))) {
      problems.push(`dist/${name} differs from a fresh build`);
    }
  }
  if (problems.length === 0) console.log(`check-bundle: dist/ equals a fresh build (${fresh.size} files)`);
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
if (problems.length > 0) {
  console.error(`check-bundle: the committed bundle is not what the source builds:\n  ${problems.join('\n  ')}`);
  console.error('Run `npm ci && npm run build` in frontend-demo/ and commit dist/.');
  process.exit(1);
}
