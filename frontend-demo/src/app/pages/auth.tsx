import { useState } from 'preact/hooks';

import { graphql } from '../../lib/graphql';
import { Card, ErrorNotice } from '../components';
import { useSession } from '../context';
import { useMutation } from '../hooks';

const SignIn = graphql(`
  mutation SignIn($handle: String!, $password: String!) { signIn(handle: $handle, password: $password) { token } }
`);
const SignUp = graphql(`
  mutation SignUp($handle: String!, $password: String!) { signUp(handle: $handle, password: $password) { token } }
`);

export function AuthPage() {
  const session = useSession();
  const [signIn, signingIn] = useMutation(SignIn);
  const [signUp, signingUp] = useMutation(SignUp);
  const [handle, setHandle] = useState('');
  const [password, setPassword] = useState('');
  // The last attempt's error: a failed sign-up should not leave an older sign-in error on show.
  const [last, setLast] = useState<'in' | 'up'>('in');

  async function submit(event: SubmitEvent) {
    event.preventDefault();
    const creating = (event.submitter as HTMLButtonElement | null)?.value === 'up';
    setLast(creating ? 'up' : 'in');
    const token = creating
      ? (await signUp({ handle, password }))?.signUp.token
      : (await signIn({ handle, password }))?.signIn.token;
    if (token) {
      session.signIn(token);
      location.hash = '#/';
    }
  }

  if (session.viewer) {
    return (
      <p>
        Signed in as <strong>{session.viewer.handle}</strong>.{' '}
        <button type="button" onClick={session.signOut}>
          Sign out
        </button>
      </p>
    );
  }
  return (
    <>
      <h1>Sign in</h1>
      <Card label="Sign in or sign up">
        <form onSubmit={submit} class="stack narrow">
          <label>
            Handle
            <input name="handle" autoComplete="username" value={handle} onInput={(e) => setHandle(e.currentTarget.value)} />
          </label>
          <label>
            Password
            <input
              name="password"
              type="password"
              autoComplete="current-password"
              value={password}
              onInput={(e) => setPassword(e.currentTarget.value)}
            />
          </label>
          <ErrorNotice error={last === 'in' ? signingIn.error : signingUp.error} />
          <div class="row-buttons">
            <button type="submit" value="in" disabled={signingIn.busy || signingUp.busy}>
              Sign in
            </button>
            <button type="submit" value="up" class="secondary" disabled={signingIn.busy || signingUp.busy}>
              Sign up
            </button>
          </div>
          <p class="muted small">
            Handles are 3–32 letters, digits or <code>_</code>; passwords 8–128 characters. After <code>pulse seed-demo</code>,{' '}
            <code>alice</code> (an admin), <code>bob</code>, <code>carol</code> and <code>dana</code> have the password{' '}
            <code>pulse-demo-password</code>.
          </p>
        </form>
      </Card>
    </>
  );
}
