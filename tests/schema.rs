//! The checked-in `schema.graphql` is what clients code against; it must match the code.

#[test]
fn schema_graphql_matches_the_code() {
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schema.graphql"))
            .expect("schema.graphql exists");
    assert!(
        checked_in == pulse::graphql::schema::sdl(),
        "schema.graphql is stale: run `cargo run -- print-schema > schema.graphql`"
    );
}

/// The websocket driver keeps only the latest unsent message of a snapshot field and never drops
/// an event; a subscription field missing from the list would be treated as events, silently.
#[test]
fn every_subscription_field_says_whether_it_sends_snapshots_or_events() {
    let sdl = pulse::graphql::schema::sdl();
    let subscription = sdl
        .split("type Subscription {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("the schema has subscriptions");
    // A field's line is its name then its arguments or its type; description lines are prose.
    let mut in_schema: Vec<&str> = subscription
        .lines()
        .filter_map(|line| {
            let (name, _) = line.trim().split_once(['(', ':'])?;
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric())).then_some(name)
        })
        .collect();
    in_schema.sort_unstable();
    let mut listed: Vec<&str> = pulse::services::LIVE_FIELDS
        .iter()
        .map(|field| field.name)
        .collect();
    listed.sort_unstable();
    assert_eq!(in_schema, listed);
}
