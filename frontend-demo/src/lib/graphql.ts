// Typed documents: gql.tada reads src/graphql-env.d.ts (generated from ../schema.graphql by
// `npm run schema`), so every query's variables and result are checked by `tsc` at build time.
import { initGraphQLTada } from 'gql.tada';

import type { introspection } from '../graphql-env';

export const graphql = initGraphQLTada<{
  introspection: introspection;
  scalars: { DateTime: string };
}>();

export type { FragmentOf, ResultOf, VariablesOf } from 'gql.tada';
export { readFragment } from 'gql.tada';
