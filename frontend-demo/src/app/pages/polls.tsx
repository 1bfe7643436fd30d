import { useEffect, useRef, useState } from 'preact/hooks';

import { graphql, type ResultOf } from '../../lib/graphql';
import { Card, ErrorNotice, Loading } from '../components';
import { useSession } from '../context';
import { useMutation, useQuery, useSubscription } from '../hooks';

export const PollList = graphql(`
  query PollList { polls(first: 20) { nodes { id title closedAt participantCount } } }
`);

const PollQuery = graphql(`
  query Poll($id: ID!) {
    poll(id: $id) {
      id title timezone periods closedAt participantCount
      rules { scope window limit channel device }
    }
  }
`);

const BoardChanged = graphql(`
  subscription BoardChanged($id: ID!, $period: Period!, $board: Board!) {
    leaderboardChanged(pollId: $id, period: $period, board: $board, first: 10) {
      version periodStart totalOptions
      entries {
        rank score gapToAhead
        ahead { label }
        previousPeriod { rank score }
        option { id label participantCount }
      }
    }
  }
`);

const CastVote = graphql(`
  mutation CastVote($poll: ID!, $option: ID!) {
    castVotes(input: { ballots: [{ pollId: $poll, optionId: $option }], device: "web" }) {
      results {
        optionId accepted reason retryAfterSeconds
        rejectedBy { scope window limit channel device }
        standing { rank score }
      }
    }
  }
`);

type Poll = NonNullable<ResultOf<typeof PollQuery>['poll']>;
type Period = Poll['periods'][number];
type BoardKind = 'DISPLAY' | 'REAL';
type Board = ResultOf<typeof BoardChanged>['leaderboardChanged'];
type Entry = Board['entries'][number];
type BallotResult = ResultOf<typeof CastVote>['castVotes']['results'][number];

export function PollsPage({ id }: { id: string | null }) {
  const polls = useQuery(PollList, {});
  const nodes = polls.data?.polls.nodes ?? [];
  const selected = id ?? nodes[0]?.id ?? null;
  return (
    <>
      <h1>Leaderboards</h1>
      <ErrorNotice error={polls.error} />
      {polls.loading && <Loading what="polls" />}
      {nodes.length > 1 && (
        <nav aria-label="Polls" class="tabs">
          {nodes.map((poll) => (
            <a key={poll.id} href={`#/polls/${encodeURIComponent(poll.id)}`} aria-current={poll.id === selected ? 'page' : undefined}>
              {poll.title}
            </a>
          ))}
        </nav>
      )}
      {!polls.loading && nodes.length === 0 && <p>No polls yet. An admin creates them on the Admin page.</p>}
      {selected && <PollBoard key={selected} id={selected} />}
    </>
  );
}

function PollBoard({ id }: { id: string }) {
  const poll = useQuery(PollQuery, { id });
  if (poll.error) return <ErrorNotice error={poll.error} />;
  if (!poll.data) return <Loading what="the poll" />;
  if (!poll.data.poll) return <p role="alert">No poll has the id {id}.</p>;
  return <Dashboard poll={poll.data.poll} onVoted={poll.refetch} />;
}

function Dashboard({ poll, onVoted }: { poll: Poll; onVoted(): void }) {
  const [period, setPeriod] = useState<Period>(poll.periods.includes('DAY') ? 'DAY' : poll.periods[0]);
  const [board, setBoard] = useState<BoardKind>('DISPLAY');
  const [snapshot, setSnapshot] = useState<Board | null>(null);
  // Ranks in the snapshot before this one, to show who just moved.
  const previousRanks = useRef(new Map<string, number | null>());
  const [moves, setMoves] = useState(new Map<string, number>());

  useEffect(() => {
    setSnapshot(null);
    previousRanks.current = new Map();
  }, [period, board]);

  const error = useSubscription(BoardChanged, { id: poll.id, period, board }, (data) => {
    const next = data.leaderboardChanged;
    setSnapshot((current) => {
      // Versions only grow; an older snapshot arriving late is dropped.
      if (current && BigInt(next.version) < BigInt(current.version)) return current;
      const moved = new Map<string, number>();
      for (const entry of next.entries) {
        const before = previousRanks.current.get(entry.option.id);
        if (before != null && entry.rank != null && before !== entry.rank) moved.set(entry.option.id, before - entry.rank);
      }
      previousRanks.current = new Map(next.entries.map((entry) => [entry.option.id, entry.rank]));
      setMoves(moved);
      return next;
    });
  });

  return (
    <Card label={`Poll ${poll.title}`}>
      <h2>{poll.title}</h2>
      <p class="muted">
        {poll.closedAt ? 'Closed' : 'Open'} · <span data-testid="participants">{poll.participantCount}</span> participants ·{' '}
        {poll.timezone}
        {snapshot && ` · ${snapshot.totalOptions} options`}
      </p>
      <div class="switches">
        <fieldset>
          <legend>Period</legend>
          {poll.periods.map((value) => (
            <label key={value}>
              <input type="radio" name="period" value={value} checked={period === value} onChange={() => setPeriod(value)} />{' '}
              {label(value)}
            </label>
          ))}
        </fieldset>
        <fieldset>
          <legend>Board</legend>
          {(['DISPLAY', 'REAL'] as const).map((value) => (
            <label key={value}>
              <input type="radio" name="board" value={value} checked={board === value} onChange={() => setBoard(value)} />{' '}
              {value === 'DISPLAY' ? 'Display (with bonus)' : 'Real votes'}
            </label>
          ))}
        </fieldset>
      </div>
      <ErrorNotice error={error} />
      {snapshot ? (
        <Chart pollId={poll.id} snapshot={snapshot} moves={moves} period={period} closed={!!poll.closedAt} onVoted={onVoted} />
      ) : (
        !error && <Loading what="the leaderboard" />
      )}
      {poll.rules.length > 0 && (
        <p class="muted small">
          Limits:{' '}
          {poll.rules
            .map((rule) => `${rule.limit} per ${rule.window.toLowerCase()} per ${rule.scope.toLowerCase()}${rule.channel ? ` (${rule.channel})` : ''}${rule.device ? ` on ${rule.device}` : ''}`)
            .join('; ')}
        </p>
      )}
    </Card>
  );
}

const ROW_HEIGHT = 84;

/** Bars keyed by option: when ranks change, rows slide to their new place and bars grow. */
function Chart(props: { pollId: string; snapshot: Board; moves: Map<string, number>; period: Period; closed: boolean; onVoted(): void }) {
  const { entries } = props.snapshot;
  const top = Math.max(1, ...entries.map((entry) => entry.score));
  // Rows are rendered in a stable order (by option) and placed by rank, so a CSS transition can
  // animate the move; screen readers get the ranked order from aria-rowindex-like labels.
  const stable = [...entries].sort((a, b) => a.option.id.localeCompare(b.option.id));
  const position = new Map(entries.map((entry, index) => [entry.option.id, index]));
  return (
    <div class="chart" role="list" aria-label="Leaderboard" style={{ height: `${entries.length * ROW_HEIGHT}px` }}>
      {stable.map((entry) => (
        <Row
          key={entry.option.id}
          entry={entry}
          top={top}
          offset={(position.get(entry.option.id) ?? 0) * ROW_HEIGHT}
          moved={props.moves.get(entry.option.id) ?? 0}
          period={props.period}
          pollId={props.pollId}
          closed={props.closed}
          onVoted={props.onVoted}
        />
      ))}
    </div>
  );
}

function Row(props: { entry: Entry; top: number; offset: number; moved: number; period: Period; pollId: string; closed: boolean; onVoted(): void }) {
  const { entry } = props;
  const { viewer } = useSession();
  const [vote, voting] = useMutation(CastVote);
  const [result, setResult] = useState<BallotResult | null>(null);
  async function cast() {
    const data = await vote({ poll: props.pollId, option: entry.option.id });
    const ballot = data?.castVotes.results[0] ?? null;
    setResult(ballot);
    if (ballot?.accepted) props.onVoted();
  }
  return (
    <div
      class="row"
      role="listitem"
      data-testid="board-row"
      data-option={entry.option.label}
      style={{ transform: `translateY(${props.offset}px)` }}
    >
      <span class="rank" aria-label={`rank ${entry.rank ?? 'none'}`}>
        {entry.rank ?? '–'}
        {props.moved > 0 && <span class="up" title={`up ${props.moved}`}>▲{props.moved}</span>}
        {props.moved < 0 && <span class="down" title={`down ${-props.moved}`}>▼{-props.moved}</span>}
      </span>
      <div class="bar-area">
        <div class="bar-label">
          <strong>{entry.option.label}</strong> <span class="score" data-testid="score">{format(entry.score)}</span>
        </div>
        <div class="bar" style={{ width: `${(100 * entry.score) / props.top}%` }} />
        <div class="muted small details">
          {entry.option.participantCount} voters
          {entry.ahead && entry.gapToAhead != null && ` · ${format(entry.gapToAhead)} behind ${entry.ahead.label}`}
          {' · '}
          <span data-testid="previous-period">{previous(entry, props.period)}</span>
        </div>
      </div>
      <div class="vote">
        <button
          type="button"
          disabled={!viewer || voting.busy || props.closed}
          title={viewer ? undefined : 'Sign in to vote'}
          onClick={cast}
          aria-label={`Vote for ${entry.option.label}`}
        >
          Vote
        </button>
        <VoteOutcome result={result} />
        <ErrorNotice error={voting.error} />
      </div>
    </div>
  );
}

function VoteOutcome({ result }: { result: BallotResult | null }) {
  const retryAt = result?.retryAfterSeconds != null ? Date.now() + result.retryAfterSeconds * 1000 : null;
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    if (!retryAt) return;
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, [result]);
  if (!result) return null;
  if (result.accepted) return <span class="ok small" role="status">Counted</span>;
  const rule = result.rejectedBy;
  const left = retryAt ? Math.max(0, Math.ceil((retryAt - now) / 1000)) : null;
  return (
    <span class="rejected small" role="alert">
      Not counted: {result.reason}
      {rule && ` (${rule.limit} per ${rule.window.toLowerCase()} per ${rule.scope.toLowerCase()})`}
      {left != null && (left > 0 ? `; retry in ${left} s` : '; you may vote again')}
    </span>
  );
}

function previous(entry: Entry, period: Period): string {
  if (period === 'ALL_TIME') return 'all time';
  const before = entry.previousPeriod;
  if (!before || before.rank == null) return `new this ${label(period).toLowerCase()}`;
  const delta = entry.score - before.score;
  const ranks = entry.rank != null ? before.rank - entry.rank : 0;
  const rankText = ranks === 0 ? 'same rank' : ranks > 0 ? `up ${ranks}` : `down ${-ranks}`;
  return `${delta >= 0 ? '+' : ''}${format(delta)} and ${rankText} vs last ${label(period).toLowerCase()} (#${before.rank})`;
}

function label(period: Period): string {
  return { HOUR: 'Hour', DAY: 'Day', WEEK: 'Week', MONTH: 'Month', ALL_TIME: 'All time' }[period];
}

function format(value: number): string {
  return Number.isInteger(value) ? value.toLocaleString('en') : value.toFixed(1);
}
