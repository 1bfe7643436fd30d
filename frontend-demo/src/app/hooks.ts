// The three ways a page talks to Pulse, as Preact hooks over the session's urql client.
import type { AnyVariables, CombinedError, TypedDocumentNode } from '@urql/core';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';

import { useSession } from './context';

export interface QueryState<Data> {
  data: Data | null;
  error: CombinedError | null;
  loading: boolean;
  refetch(): void;
}

/**
 * Runs a query on mount and whenever `variables` change (compared as JSON). One that failed on the
 * network (the server restarting, say) runs again once the live socket connects again, so a page
 * heals by itself, as its subscriptions do.
 */
export function useQuery<Data, Variables extends AnyVariables>(
  document: TypedDocumentNode<Data, Variables>,
  variables: Variables,
  options: { pause?: boolean } = {},
): QueryState<Data> {
  const { api, connections } = useSession();
  const [state, setState] = useState<{ data: Data | null; error: CombinedError | null; loading: boolean }>({
    data: null,
    error: null,
    loading: !options.pause,
  });
  const [generation, setGeneration] = useState(0);
  const key = JSON.stringify(variables);
  useEffect(() => {
    if (options.pause) return;
    let current = true;
    setState((previous) => ({ ...previous, loading: true }));
    api.client
      .query(document, variables)
      .toPromise()
      .then((result) => {
        if (current) setState({ data: result.data ?? null, error: result.error ?? null, loading: false });
      });
    return () => {
      current = false;
    };
  }, [api, document, key, generation, options.pause]);
  const refetch = useCallback(() => setGeneration((n) => n + 1), []);
  useEffect(() => {
    if (state.error?.networkError) refetch();
  }, [connections]);
  return { ...state, refetch };
}

export interface MutationState {
  error: CombinedError | null;
  busy: boolean;
}

/** A mutation to run on demand: resolves with its data, or null after showing its error. */
export function useMutation<Data, Variables extends AnyVariables>(
  document: TypedDocumentNode<Data, Variables>,
): [(variables: Variables) => Promise<Data | null>, MutationState] {
  const { api } = useSession();
  const [state, setState] = useState<MutationState>({ error: null, busy: false });
  const run = useCallback(
    async (variables: Variables) => {
      setState({ error: null, busy: true });
      const result = await api.client.mutation(document, variables).toPromise();
      setState({ error: result.error ?? null, busy: false });
      return result.error ? null : (result.data ?? null);
    },
    [api, document],
  );
  return [run, state];
}

/**
 * Subscribes while mounted (and again when `variables` change), calling `onData` with every
 * event. Returns the last error, if the subscription failed.
 */
export function useSubscription<Data, Variables extends AnyVariables>(
  document: TypedDocumentNode<Data, Variables>,
  variables: Variables,
  onData: (data: Data) => void,
  options: { pause?: boolean } = {},
): CombinedError | null {
  const { api } = useSession();
  const [error, setError] = useState<CombinedError | null>(null);
  // The latest callback, without resubscribing each render.
  const handler = useRef(onData);
  handler.current = onData;
  const key = JSON.stringify(variables);
  useEffect(() => {
    if (options.pause) return;
    setError(null);
    const { unsubscribe } = api.client.subscription(document, variables).subscribe((result) => {
      if (result.error) setError(result.error);
      else if (result.data) handler.current(result.data);
    });
    return unsubscribe;
  }, [api, document, key, options.pause]);
  return error;
}
