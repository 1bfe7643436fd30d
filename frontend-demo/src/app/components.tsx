import type { CombinedError } from '@urql/core';
import type { ComponentChildren } from 'preact';

import { errorLines } from '../lib/api';
import { graphql } from '../lib/graphql';
import { useSession } from './context';
import { useMutation } from './hooks';

/** An API error in words: every message with its code. Never swallowed, never a bare "failed". */
export function ErrorNotice({ error }: { error: CombinedError | Error | null | undefined }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      {errorLines(error).map((line, index) => (
        <p key={index}>
          {line.message}
          {line.code && <code class="code">{line.code}</code>}
        </p>
      ))}
    </div>
  );
}

export function Loading({ what }: { what: string }) {
  return <p class="muted" aria-live="polite">Loading {what}…</p>;
}

export function Card({ children, label }: { children: ComponentChildren; label?: string }) {
  return (
    <section class="card" aria-label={label}>
      {children}
    </section>
  );
}

const Like = graphql(`
  mutation Like($id: ID!) { like(subjectId: $id) { liked likeCount } }
`);
const Unlike = graphql(`
  mutation Unlike($id: ID!) { unlike(subjectId: $id) { liked likeCount } }
`);

/** Likes or unlikes an article or a comment; the answer carries the new count at once. */
export function LikeButton(props: {
  subjectId: string;
  liked: boolean;
  count: number;
  onChange(liked: boolean, count: number): void;
}) {
  const { viewer } = useSession();
  const [like, liking] = useMutation(Like);
  const [unlike, unliking] = useMutation(Unlike);
  const busy = liking.busy || unliking.busy;
  async function toggle() {
    const data = props.liked ? (await unlike({ id: props.subjectId }))?.unlike : (await like({ id: props.subjectId }))?.like;
    if (data) props.onChange(data.liked, data.likeCount);
  }
  return (
    <span class="like">
      <button
        type="button"
        class={props.liked ? 'liked' : ''}
        aria-pressed={props.liked}
        disabled={busy}
        title={viewer ? undefined : 'Sign in to like'}
        onClick={toggle}
      >
        {props.liked ? '♥ Liked' : '♡ Like'}
      </button>{' '}
      <span class="count" data-testid="like-count">
        {props.count}
      </span>{' '}
      likes
      <ErrorNotice error={liking.error ?? unliking.error} />
    </span>
  );
}

const Follow = graphql(`
  mutation Follow($id: ID!) { follow(userId: $id) { following user { id followerCount } } }
`);
const Unfollow = graphql(`
  mutation Unfollow($id: ID!) { unfollow(userId: $id) { following user { id followerCount } } }
`);

export function FollowButton(props: {
  userId: string;
  handle: string;
  following: boolean;
  onChange(following: boolean, followerCount: number): void;
}) {
  const [follow, following] = useMutation(Follow);
  const [unfollow, unfollowing] = useMutation(Unfollow);
  async function toggle() {
    const data = props.following ? (await unfollow({ id: props.userId }))?.unfollow : (await follow({ id: props.userId }))?.follow;
    if (data) props.onChange(data.following, data.user.followerCount);
  }
  return (
    <>
      <button type="button" aria-pressed={props.following} disabled={following.busy || unfollowing.busy} onClick={toggle}>
        {props.following ? `Unfollow ${props.handle}` : `Follow ${props.handle}`}
      </button>
      <ErrorNotice error={following.error ?? unfollowing.error} />
    </>
  );
}

export function timeAgo(iso: string): string {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return 'just now';
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}
