import { useState } from 'preact/hooks';

import { graphql, type VariablesOf } from '../../lib/graphql';
import { Card, ErrorNotice, Loading } from '../components';
import { useSession } from '../context';
import { useMutation, useQuery } from '../hooks';
import { PollList } from './polls';

const CreatePoll = graphql(`
  mutation CreatePoll($input: CreatePollInput!) { createPoll(input: $input) { id title } }
`);

const ClosePoll = graphql(`
  mutation ClosePoll($id: ID!) { closePoll(id: $id) { id closedAt } }
`);

type Input = VariablesOf<typeof CreatePoll>['input'];
type Period = NonNullable<Input['periods']>[number];
type Rule = NonNullable<Input['rules']>[number];
type Option = NonNullable<Input['options']>[number];

const PERIODS: Period[] = ['HOUR', 'DAY', 'WEEK', 'MONTH', 'ALL_TIME'];
const SCOPES: Rule['scope'][] = ['VOTER', 'IP', 'OPTION'];
const WINDOWS: Rule['window'][] = ['SECOND', 'MINUTE', 'HOUR', 'DAY', 'WEEK', 'MONTH', 'POLL'];

export function AdminPage() {
  const { viewer } = useSession();
  if (!viewer?.isAdmin) {
    return (
      <>
        <h1>Admin</h1>
        <p>Creating and closing polls is for admins. Sign in as one (the demo's <code>alice</code> is).</p>
      </>
    );
  }
  return <PollAdmin />;
}

function PollAdmin() {
  const polls = useQuery(PollList, {});
  const [closePoll, closing] = useMutation(ClosePoll);
  return (
    <>
      <h1>Admin</h1>
      <CreatePollForm onCreated={polls.refetch} />
      <Card label="Polls">
        <h2>Polls</h2>
        <ErrorNotice error={polls.error ?? closing.error} />
        {polls.loading && <Loading what="polls" />}
        <ul class="people">
          {polls.data?.polls.nodes.map((poll) => (
            <li key={poll.id}>
              <a href={`#/polls/${encodeURIComponent(poll.id)}`}>{poll.title}</a>{' '}
              <span class="muted">{poll.participantCount} participants</span>{' '}
              {poll.closedAt ? (
                <span class="muted">closed</span>
              ) : (
                <button type="button" disabled={closing.busy} onClick={() => closePoll({ id: poll.id }).then(polls.refetch)}>
                  Close {poll.title}
                </button>
              )}
            </li>
          ))}
        </ul>
      </Card>
    </>
  );
}

function CreatePollForm({ onCreated }: { onCreated(): void }) {
  const [create, state] = useMutation(CreatePoll);
  const [title, setTitle] = useState('');
  const [timezone, setTimezone] = useState(Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC');
  const [periods, setPeriods] = useState<Period[]>(['HOUR', 'DAY', 'ALL_TIME']);
  const [carryOver, setCarryOver] = useState('0');
  const [options, setOptions] = useState<Option[]>([{ label: '' }, { label: '' }]);
  const [rules, setRules] = useState<Rule[]>([{ scope: 'VOTER', window: 'MINUTE', limit: 5 }]);
  const [created, setCreated] = useState<{ id: string; title: string } | null>(null);

  async function submit(event: Event) {
    event.preventDefault();
    const input: Input = { title, timezone, periods, carryOver: Number(carryOver), options, rules };
    const data = await create({ input });
    if (data) {
      setCreated(data.createPoll);
      setTitle('');
      onCreated();
    }
  }
  const setOption = (index: number, change: Partial<Option>) =>
    setOptions(options.map((option, i) => (i === index ? { ...option, ...change } : option)));
  const setRule = (index: number, change: Partial<Rule>) =>
    setRules(rules.map((rule, i) => (i === index ? { ...rule, ...change } : rule)));

  return (
    <Card label="Create a poll">
      <form onSubmit={submit} class="stack">
        <h2>Create a poll</h2>
        <label>
          Title
          <input value={title} onInput={(e) => setTitle(e.currentTarget.value)} />
        </label>
        <div class="grid2">
          <label>
            Time zone (IANA)
            <input value={timezone} onInput={(e) => setTimezone(e.currentTarget.value)} />
          </label>
          <label>
            Carry-over into the next period (0–1)
            <input inputMode="decimal" value={carryOver} onInput={(e) => setCarryOver(e.currentTarget.value)} />
          </label>
        </div>
        <fieldset>
          <legend>Periods</legend>
          {PERIODS.map((period) => (
            <label key={period} class="inline">
              <input
                type="checkbox"
                checked={periods.includes(period)}
                onChange={(e) =>
                  setPeriods(e.currentTarget.checked ? PERIODS.filter((p) => p === period || periods.includes(p)) : periods.filter((p) => p !== period))
                }
              />{' '}
              {period}
            </label>
          ))}
        </fieldset>
        <fieldset>
          <legend>Options</legend>
          {options.map((option, index) => (
            <div class="grid3" key={index}>
              <label>
                Option {index + 1} label
                <input value={option.label} onInput={(e) => setOption(index, { label: e.currentTarget.value })} />
              </label>
              <label>
                Bonus per vote
                <input type="number" min={1} value={option.bonus ?? 1} onInput={(e) => setOption(index, { bonus: Number(e.currentTarget.value) })} />
              </label>
              <label>
                Initial votes
                <input type="number" min={0} value={option.initialVotes ?? 0} onInput={(e) => setOption(index, { initialVotes: Number(e.currentTarget.value) })} />
              </label>
            </div>
          ))}
          <button type="button" onClick={() => setOptions([...options, { label: '' }])}>
            Add an option
          </button>
        </fieldset>
        <fieldset>
          <legend>Rate limits</legend>
          {rules.map((rule, index) => (
            <div class="grid5" key={index}>
              <label>
                Scope
                <select value={rule.scope} onChange={(e) => setRule(index, { scope: e.currentTarget.value as Rule['scope'] })}>
                  {SCOPES.map((scope) => <option key={scope}>{scope}</option>)}
                </select>
              </label>
              <label>
                Window
                <select value={rule.window} onChange={(e) => setRule(index, { window: e.currentTarget.value as Rule['window'] })}>
                  {WINDOWS.map((window) => <option key={window}>{window}</option>)}
                </select>
              </label>
              <label>
                Limit
                <input type="number" min={1} value={rule.limit} onInput={(e) => setRule(index, { limit: Number(e.currentTarget.value) })} />
              </label>
              <label>
                Channel
                <input value={rule.channel ?? ''} onInput={(e) => setRule(index, { channel: e.currentTarget.value || null })} />
              </label>
              <button type="button" onClick={() => setRules(rules.filter((_, i) => i !== index))}>
                Remove rule {index + 1}
              </button>
            </div>
          ))}
          <button type="button" onClick={() => setRules([...rules, { scope: 'VOTER', window: 'HOUR', limit: 10 }])}>
            Add a rule
          </button>
        </fieldset>
        <ErrorNotice error={state.error} />
        {created && (
          <p class="ok" role="status">
            Created <a href={`#/polls/${encodeURIComponent(created.id)}`}>{created.title}</a>.
          </p>
        )}
        <button type="submit" disabled={state.busy}>
          Create poll
        </button>
      </form>
    </Card>
  );
}
