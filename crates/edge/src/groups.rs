//! Groups of identical live operations: the operations whose request is the same (document,
//! operation name, variables, extensions), which are snapshots and read nothing of the viewer,
//! share one async-graphql stream, whichever transport carries them (a websocket, a distinct SSE
//! or multipart stream). Each result is resolved and serialized once per group
//! and the same bytes go to every member; a member costs an entry in its group, not a stream.
//!
//! A group runs with the data [`Groups::new`] was given for an anonymous caller, never with one
//! member's connection data: if the viewer classification missed a field that depends on the
//! viewer, the shared answer is the anonymous one, never another viewer's.
//!
//! A member joins with the [`Recipient`] its results are handed to, the client's id and a token of
//! its own, so that a delivery of an old membership is told apart from one of a new operation that
//! reuses the id. A late joiner gets the group's last result at once; the end of the group's
//! stream reaches every member; a group with no member left stops its stream.
//!
//! A result is handed to the members the group had when it came, outside the group's lock: a
//! recipient may write to a socket, and a fan-out to thousands of them must not hold up a joiner
//! or a leaver. A recipient therefore tells a delivery to a membership that has just ended by its
//! token (or its own bookkeeping) and drops it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_graphql::{Data, Executor, Request, Response};
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::counted::Counted;

/// Groups running, each with one stream.
pub const GROUPS_RUNNING: &str = "pulse_live_groups";
/// Results serialized by groups: one per result of a group, however many members it has.
pub const GROUP_PAYLOADS: &str = "pulse_live_group_payloads_total";
/// Shared results handed to members (a late joiner's last result included).
pub const GROUP_DELIVERIES: &str = "pulse_live_group_deliveries_total";

/// Members handed a result in one turn of the group's task before it lets the worker's other
/// tasks run: a recipient may write to a socket (a few µs each), and a request queued behind a
/// fan-out to 10,000 would otherwise wait for all of it.
const FAN_OUT_TURN: usize = 256;

type Run = dyn Fn(Request) -> BoxStream<'static, Response> + Send + Sync;

/// The process's groups, by request. Made once by the server from its executor.
pub struct Groups {
    run: Box<Run>,
    running: Mutex<HashMap<String, Arc<Group>>>,
    tokens: AtomicU64,
    /// [`GROUP_PAYLOADS`] and [`GROUP_DELIVERIES`] of these groups alone, which the metrics of a
    /// process with several servers (tests) mix.
    payloads: AtomicU64,
    deliveries: AtomicU64,
}

impl fmt::Debug for Groups {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Groups")
            .field("running", &lock(&self.running).len())
            .finish_non_exhaustive()
    }
}

struct Group {
    key: String,
    stop: CancellationToken,
    state: Mutex<GroupState>,
}

#[derive(Default)]
struct GroupState {
    /// The serialized last result, for late joiners.
    last: Option<Arc<str>>,
    members: HashMap<u64, Member>,
    /// The stream ended or stopped: a joiner starts a new group.
    ended: bool,
}

#[derive(Clone)]
struct Member {
    id: Arc<str>,
    recipient: Arc<dyn Recipient>,
}

impl Member {
    fn deliver(&self, token: u64, payload: Option<&Arc<str>>) {
        self.recipient.deliver(&self.id, token, payload);
    }
}

/// Where a member's results go. A result is handed over outside the group's lock; only a late
/// joiner's last result (handed over by its own joining) and the end of the stream are handed over
/// under it, so a recipient must not wait on anything that may be waiting to join or leave.
pub trait Recipient: Send + Sync + 'static {
    /// Hands operation `id` of membership `token` a serialized `Response`, or, with `None`, the
    /// end of the group's stream.
    fn deliver(&self, id: &Arc<str>, token: u64, payload: Option<&Arc<str>>);
}

/// A channel of [`Delivery`]s: a recipient for a transport that reads its results in its own task.
impl Recipient for mpsc::UnboundedSender<Delivery> {
    fn deliver(&self, id: &Arc<str>, token: u64, payload: Option<&Arc<str>>) {
        // A connection that ended has dropped its receiver; its memberships leave as it drops them.
        let _ = self.send(Delivery {
            id: id.clone(),
            token,
            payload: payload.cloned(),
        });
    }
}

/// What a group sends one member, on its connection's channel.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The client's id of the operation.
    pub id: Arc<str>,
    /// The membership it is for.
    pub token: u64,
    /// A serialized `Response`, or `None` when the group's stream ended.
    pub payload: Option<Arc<str>>,
}

/// A member's place in its group; dropping it leaves the group.
pub struct Membership {
    groups: Arc<Groups>,
    group: Arc<Group>,
    token: u64,
}

impl Membership {
    /// The token its deliveries carry.
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.groups.leave(&self.group, self.token);
    }
}

impl fmt::Debug for Membership {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Membership")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Groups {
    /// Groups whose streams `executor` runs, each with the data `anonymous` builds: what a caller
    /// who is no one in particular sees.
    pub fn new<E: Executor>(
        executor: E,
        anonymous: impl Fn() -> Data + Send + Sync + 'static,
    ) -> Arc<Self> {
        let run = move |request| executor.execute_stream(request, Some(Arc::new(anonymous())));
        Arc::new(Self {
            run: Box::new(run),
            running: Mutex::default(),
            tokens: AtomicU64::new(0),
            payloads: AtomicU64::new(0),
            deliveries: AtomicU64::new(0),
        })
    }

    /// Joins the group of `request` (starting it if none runs) as operation `id`, whose results
    /// go to `recipient`.
    pub fn join(
        self: &Arc<Self>,
        mut request: Request,
        id: &str,
        recipient: Arc<dyn Recipient>,
    ) -> Membership {
        // Data a transport put in the request (its caller's) would win over the anonymous data.
        request.data = Data::default();
        let key = key(&request);
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let member = Member {
            id: id.into(),
            recipient,
        };
        let mut running = lock(&self.running);
        if let Some(group) = running.get(&key) {
            let mut state = lock(&group.state);
            if !state.ended {
                if let Some(last) = &state.last {
                    member.deliver(token, Some(last));
                    self.delivered(&metrics::counter!(GROUP_DELIVERIES), 1);
                }
                state.members.insert(token, member);
                drop(state);
                return Membership {
                    groups: self.clone(),
                    group: group.clone(),
                    token,
                };
            }
        }
        let group = Arc::new(Group {
            key: key.clone(),
            stop: CancellationToken::new(),
            state: Mutex::new(GroupState {
                members: HashMap::from([(token, member)]),
                ..GroupState::default()
            }),
        });
        running.insert(key, group.clone());
        drop(running);
        let stream = (self.run)(request);
        // Outside tokio's cooperative budget: a recipient that writes to its socket spends it, and
        // past 128 writes in one turn each further one would be refused and handed back to its
        // connection's task (woken for it), which is the cost writing from here saves.
        let drive = self.clone().drive(group.clone(), stream);
        tokio::spawn(tokio::task::unconstrained(drive));
        Membership {
            groups: self.clone(),
            group,
            token,
        }
    }

    /// Serializes each result of the group's stream once and hands it to every member, until the
    /// stream ends (then every member hears it) or its last member leaves.
    async fn drive(self: Arc<Self>, group: Arc<Group>, mut stream: BoxStream<'static, Response>) {
        let _running = Counted::new(metrics::gauge!(GROUPS_RUNNING));
        // However the stream stops (its end, its last member leaving, a resolver's panic), the
        // group leaves the registry and its members hear the end: no joiner waits on a dead one.
        let _ending = Ending {
            groups: self.clone(),
            group: group.clone(),
        };
        let (payloads, deliveries) = (
            metrics::counter!(GROUP_PAYLOADS),
            metrics::counter!(GROUP_DELIVERIES),
        );
        // The members a result goes to, taken under the lock and handed it after; kept between
        // results for its allocation.
        let mut audience: Vec<(u64, Member)> = Vec::new();
        loop {
            let response = tokio::select! {
                biased;
                () = group.stop.cancelled() => return,
                response = stream.next() => response,
            };
            let Some(response) = response else { break };
            // A response always serializes (async-graphql unwraps the same call); were it not to,
            // the group ends as an ended stream does rather than send members nothing.
            let Ok(payload) = serde_json::to_string(&response) else {
                break;
            };
            let payload: Arc<str> = payload.into();
            payloads.increment(1);
            self.payloads.fetch_add(1, Ordering::Relaxed);
            {
                let mut state = lock(&group.state);
                audience.extend(
                    state
                        .members
                        .iter()
                        .map(|(token, member)| (*token, member.clone())),
                );
                state.last = Some(payload.clone());
            }
            for (n, (token, member)) in audience.iter().enumerate() {
                if n > 0 && n % FAN_OUT_TURN == 0 {
                    tokio::task::yield_now().await;
                }
                member.deliver(*token, Some(&payload));
            }
            self.delivered(&deliveries, audience.len() as u64);
            audience.clear();
        }
    }

    fn leave(&self, group: &Arc<Group>, token: u64) {
        let mut running = lock(&self.running);
        let mut state = lock(&group.state);
        if state.members.remove(&token).is_none() || !state.members.is_empty() {
            return;
        }
        state.ended = true;
        group.stop.cancel();
        unregister(&mut running, group);
    }

    fn delivered(&self, counter: &metrics::Counter, members: u64) {
        counter.increment(members);
        self.deliveries.fetch_add(members, Ordering::Relaxed);
    }

    /// How many groups run.
    pub fn running(&self) -> usize {
        lock(&self.running).len()
    }

    /// Results these groups serialized, one per result of a group.
    pub fn payloads(&self) -> u64 {
        self.payloads.load(Ordering::Relaxed)
    }

    /// Serialized results these groups handed to members.
    pub fn deliveries(&self) -> u64 {
        self.deliveries.load(Ordering::Relaxed)
    }
}

/// Ends a group when its stream stops.
struct Ending {
    groups: Arc<Groups>,
    group: Arc<Group>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        let mut running = lock(&self.groups.running);
        unregister(&mut running, &self.group);
        let mut state = lock(&self.group.state);
        state.ended = true;
        for (token, member) in state.members.drain() {
            member.deliver(token, None);
        }
    }
}

/// Takes `group` out of the registry, unless a newer group of its request took its place.
fn unregister(running: &mut HashMap<String, Arc<Group>>, group: &Arc<Group>) {
    if running
        .get(&group.key)
        .is_some_and(|current| Arc::ptr_eq(current, group))
    {
        running.remove(&group.key);
    }
}

/// What makes two requests the same operation: everything a client sends of one, with the keys
/// of every object sorted, so that the order a client wrote its variables in does not split a
/// group. Sorted here rather than left to serde_json, whose maps keep insertion order once any crate
/// of an application turns on its `preserve_order` feature.
fn key(request: &Request) -> String {
    let whole = serde_json::json!({
        "query": request.query,
        "operationName": request.operation_name,
        "variables": request.variables,
        "extensions": request.extensions,
    });
    let mut key = String::with_capacity(request.query.len() + 64);
    canonical(&whole, &mut key);
    key
}

fn canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by_key(|(name, _)| *name);
            out.push('{');
            for (n, (name, value)) in entries.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::from(name.as_str()).to_string());
                out.push(':');
                canonical(value, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_graphql::{EmptyMutation, Object, Schema, Subscription};
    use futures_util::Stream;
    use tokio::sync::broadcast;

    use super::*;

    struct Query;

    #[Object]
    impl Query {
        async fn zero(&self) -> i32 {
            0
        }
    }

    /// Who a stream runs for, as the anonymous data names it.
    struct Caller(&'static str);

    struct Subscription;

    #[Subscription]
    impl Subscription {
        /// Each published value times `factor`, with the caller's name.
        async fn board(
            &self,
            ctx: &async_graphql::Context<'_>,
            factor: i32,
        ) -> impl Stream<Item = String> + use<> {
            let caller = ctx.data_unchecked::<Caller>().0;
            let changes = ctx.data_unchecked::<broadcast::Sender<i32>>().subscribe();
            futures_util::stream::unfold(changes, move |mut changes| async move {
                let value = changes.recv().await.ok()?;
                Some((format!("{caller}:{}", value * factor), changes))
            })
        }

        /// A resolver with a bug.
        async fn explode(&self) -> impl Stream<Item = i32> + use<> {
            futures_util::stream::poll_fn(|_| -> std::task::Poll<Option<i32>> {
                panic!("a resolver's bug")
            })
        }
    }

    fn groups() -> (Arc<Groups>, broadcast::Sender<i32>) {
        let (changes, _) = broadcast::channel(16);
        let schema = Schema::build(Query, EmptyMutation, Subscription)
            .data(changes.clone())
            .finish();
        let groups = Groups::new(schema, || {
            let mut data = Data::default();
            data.insert(Caller("anonymous"));
            data
        });
        (groups, changes)
    }

    fn board(variables: serde_json::Value) -> Request {
        Request::new("subscription ($factor: Int!) { board(factor: $factor) }")
            .variables(async_graphql::Variables::from_json(variables))
    }

    fn to(connection: &mpsc::UnboundedSender<Delivery>) -> Arc<dyn Recipient> {
        Arc::new(connection.clone())
    }

    async fn next(deliveries: &mut mpsc::UnboundedReceiver<Delivery>) -> Delivery {
        tokio::time::timeout(Duration::from_secs(5), deliveries.recv())
            .await
            .expect("a delivery in time")
            .expect("the channel is open")
    }

    /// Waits until the group's stream listens (or no longer does) to the changes.
    async fn listeners(changes: &broadcast::Sender<i32>, wanted: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while changes.receiver_count() != wanted {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the listeners in time");
    }

    #[tokio::test]
    async fn identical_requests_share_one_stream_and_the_same_bytes_and_others_get_their_own() {
        let (groups, changes) = groups();
        let (one, mut one_deliveries) = mpsc::unbounded_channel();
        let (other, mut other_deliveries) = mpsc::unbounded_channel();
        let mut signed_in = board(serde_json::json!({ "factor": 2 }));
        signed_in.data.insert(Caller("a member"));
        let first = groups.join(signed_in, "a", to(&one));
        let second = groups.join(board(serde_json::json!({ "factor": 2 })), "b", to(&other));
        let tripled = groups.join(board(serde_json::json!({ "factor": 3 })), "c", to(&other));
        assert_eq!(groups.running(), 2);
        listeners(&changes, 2).await;

        changes.send(5).unwrap();
        let (a, b) = (
            next(&mut one_deliveries).await,
            next(&mut other_deliveries).await,
        );
        let c = next(&mut other_deliveries).await;
        let (b, c) = if b.id.as_ref() == "b" { (b, c) } else { (c, b) };
        assert_eq!((a.id.as_ref(), a.token), ("a", first.token()));
        assert_eq!((b.id.as_ref(), b.token), ("b", second.token()));
        assert_eq!(c.token, tripled.token());
        let (a, b, c) = (a.payload.unwrap(), b.payload.unwrap(), c.payload.unwrap());
        assert!(Arc::ptr_eq(&a, &b), "one serialization for both members");
        assert_eq!(&*a, r#"{"data":{"board":"anonymous:10"}}"#);
        assert_eq!(&*c, r#"{"data":{"board":"anonymous:15"}}"#);
    }

    #[tokio::test]
    async fn a_late_joiner_gets_the_last_result_at_once_and_the_last_leaving_stops_the_stream() {
        let (groups, changes) = groups();
        let (connection, mut deliveries) = mpsc::unbounded_channel();
        let first = groups.join(
            board(serde_json::json!({ "factor": 1 })),
            "1",
            to(&connection),
        );
        listeners(&changes, 1).await;
        changes.send(7).unwrap();
        let sent = next(&mut deliveries).await.payload.unwrap();

        let late = groups.join(
            board(serde_json::json!({ "factor": 1 })),
            "2",
            to(&connection),
        );
        let at_once = deliveries
            .try_recv()
            .expect("the last result, already there");
        assert_eq!(at_once.token, late.token());
        assert!(Arc::ptr_eq(&at_once.payload.unwrap(), &sent));

        drop(first);
        assert_eq!(groups.running(), 1, "a member is left");
        drop(late);
        assert_eq!(groups.running(), 0);
        listeners(&changes, 0).await;
    }

    #[tokio::test]
    async fn the_end_of_a_groups_stream_reaches_every_member_and_a_new_joiner_starts_afresh() {
        let (groups, changes) = groups();
        let (connection, mut deliveries) = mpsc::unbounded_channel();
        // A variable of the wrong type: the stream is one error, then its end.
        let wrong = serde_json::json!({ "factor": "two" });
        let members = [
            groups.join(board(wrong.clone()), "1", to(&connection)),
            groups.join(board(wrong.clone()), "2", to(&connection)),
        ];
        let mut received = Vec::new();
        for _ in 0..4 {
            received.push(next(&mut deliveries).await);
        }
        let (errors, mut ends) = (&received[..2], received[2..].to_vec());
        assert!(errors.iter().all(|error| {
            error
                .payload
                .as_ref()
                .is_some_and(|payload| payload.contains("errors"))
        }));
        ends.sort_by_key(|end| end.token);
        assert!(ends.iter().all(|end| end.payload.is_none()));
        assert_eq!(
            ends.iter().map(|end| end.token).collect::<Vec<_>>(),
            members.iter().map(Membership::token).collect::<Vec<_>>()
        );
        assert_eq!(groups.running(), 0);
        drop(members);

        let again = groups.join(
            board(serde_json::json!({ "factor": 1 })),
            "1",
            to(&connection),
        );
        listeners(&changes, 1).await;
        changes.send(1).unwrap();
        assert_eq!(next(&mut deliveries).await.token, again.token());
    }

    #[tokio::test]
    async fn a_group_whose_resolver_panics_ends_for_its_members_and_leaves_the_registry() {
        let (groups, _) = groups();
        let (connection, mut deliveries) = mpsc::unbounded_channel();
        let member = groups.join(
            Request::new("subscription { explode }"),
            "1",
            to(&connection),
        );
        let end = next(&mut deliveries).await;
        assert_eq!((end.token, end.payload), (member.token(), None));
        assert_eq!(groups.running(), 0);
    }

    /// The board values a member is handed, in order, up to and with `last`.
    async fn values_until(
        deliveries: &mut mpsc::UnboundedReceiver<Delivery>,
        last: i32,
    ) -> Vec<i32> {
        let mut values = Vec::new();
        while values.last() != Some(&last) {
            let payload = next(deliveries)
                .await
                .payload
                .expect("a result, not the end");
            let value = payload
                .trim_end_matches("\"}}")
                .rsplit(':')
                .next()
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("a board value in {payload}"));
            values.push(value);
        }
        values
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fan_out_gives_every_member_each_result_once_while_others_join_and_leave() {
        const MEMBERS: usize = 1_000;
        const RESULTS: i32 = 20;
        let (groups, changes) = groups();
        let request = || board(serde_json::json!({ "factor": 1 }));
        let mut stayers: Vec<_> = (0..MEMBERS)
            .map(|n| {
                let (connection, deliveries) = mpsc::unbounded_channel();
                let membership = groups.join(request(), &n.to_string(), to(&connection));
                (membership, connection, deliveries)
            })
            .collect();
        listeners(&changes, 1).await;

        // Joiners and leavers come and go from another task while the results are handed out.
        let churn = {
            let groups = groups.clone();
            tokio::spawn(async move {
                let mut joiners = Vec::new();
                for n in 0..200 {
                    let (connection, deliveries) = mpsc::unbounded_channel();
                    let membership = groups.join(request(), &format!("j{n}"), to(&connection));
                    if n % 2 == 0 {
                        drop(membership);
                    } else {
                        joiners.push((membership, connection, deliveries));
                    }
                    tokio::task::yield_now().await;
                }
                joiners
            })
        };
        for value in 1..=RESULTS {
            changes.send(value).unwrap();
            // Sent no faster than handed out, so the board's channel never skips a value.
            tokio::time::timeout(Duration::from_secs(10), async {
                while stayers
                    .iter()
                    .any(|(_, _, deliveries)| deliveries.len() < value as usize)
                {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("every member has the result in time");
        }
        let mut joiners = churn.await.unwrap();
        // One more, which every member still in the group is handed after all the others.
        let last = RESULTS + 1;
        changes.send(last).unwrap();

        for (_, _, deliveries) in &mut stayers {
            assert_eq!(
                values_until(deliveries, last).await,
                (1..=last).collect::<Vec<_>>()
            );
        }
        for (_, _, deliveries) in &mut joiners {
            // The last result at once on joining, then each later one: no gap, no repeat.
            let seen = values_until(deliveries, last).await;
            assert_eq!(seen, (seen[0]..=last).collect::<Vec<_>>());
        }
        assert_eq!(groups.payloads(), last as u64);
    }

    #[test]
    fn the_key_ignores_the_order_of_object_keys_but_nothing_else() {
        let request = |variables: &str| {
            Request::new("subscription { board(factor: 1) }").variables(
                async_graphql::Variables::from_json(serde_json::from_str(variables).unwrap()),
            )
        };
        assert_eq!(
            key(&request(r#"{"a":1,"b":{"c":2,"d":3}}"#)),
            key(&request(r#"{"b":{"d":3,"c":2}, "a":1}"#))
        );
        assert_ne!(key(&request(r#"{"a":1}"#)), key(&request(r#"{"a":2}"#)));
        assert_ne!(
            key(&request("{}")),
            key(&request("{}").operation_name("Named"))
        );
    }
}
