//! The cron and interval arithmetic checked against hand-worked dates, DST changes and the missed-run rules.

use super::*;
use jiff::civil::Date;

fn ms(rfc3339: &str) -> i64 {
    rfc3339.parse::<Timestamp>().unwrap().as_millisecond()
}

fn cron(expr: &str, tz: &str) -> Recurrence {
    Recurrence::cron(expr, Some(tz)).unwrap()
}

/// Local rendering, to assert on the wall clock and the offset together.
fn local(t: i64, tz: &str) -> String {
    Timestamp::from_millisecond(t).unwrap().to_zoned(TimeZone::get(tz).unwrap()).strftime("%F %T%:z").to_string()
}

/// Occurrences in `(from, to]`.
fn between(rec: &Recurrence, from: i64, to: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut t = from;
    while let Some(n) = rec.next_after(t)
        && n <= to
    {
        out.push(n);
        t = n;
    }
    out
}

/// Occurrences on one local calendar day, rendered locally.
fn on_day(rec: &Recurrence, tz: &str, day: &str) -> Vec<String> {
    let zone = TimeZone::get(tz).unwrap();
    let date: Date = day.parse().unwrap();
    let start = date.to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
    let end = date.tomorrow().unwrap().to_zoned(zone).unwrap().timestamp().as_millisecond();
    between(rec, start - 1, end - 1).into_iter().map(|t| local(t, tz)).collect()
}

fn assert_steps(times: &[i64], step_ms: i64) {
    for w in times.windows(2) {
        assert_eq!(w[1] - w[0], step_ms, "{} -> {}", w[0], w[1]);
    }
}

#[test]
fn parses_good_expressions() {
    for expr in [
        "0 7 * * *",
        "*/15 * * * *",
        "0 9-17 * * MON-FRI",
        "30 2 1,15 jan,jul *",
        "0 0 L * *",
        "0 12 * * 5#2",
        "0 0 1 * +MON",
        "0 0 ? * 7",
        "*/10 * * * * *",
        "@daily",
        "@HOURLY",
    ] {
        let rec = Recurrence::cron(expr, None).unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert!(matches!(&rec, Recurrence::Cron { tz, .. } if tz == "UTC"), "{rec:?}");
    }
    let rec = Recurrence::cron("  0   7 * *\t* ", Some("europe/paris")).unwrap();
    assert_eq!(rec.to_string(), r#"cron "0 7 * * *" in Europe/Paris"#);
    assert_eq!(Recurrence::every("1h 30m").unwrap(), Recurrence::Every(Duration::from_secs(5400)));
    assert_eq!(Recurrence::every("1s").unwrap(), Recurrence::Every(Duration::from_secs(1)));
    assert_eq!(Recurrence::every("1500ms").unwrap(), Recurrence::Every(Duration::from_millis(1500)));
}

#[test]
fn bad_input_gets_one_clear_line() {
    let err = |r: Result<Recurrence, RecurrenceError>| r.unwrap_err().to_string();
    assert_eq!(
        err(Recurrence::cron("0 7 * *", None)),
        r#"invalid cron expression "0 7 * *": expected 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading second; got 4"#
    );
    assert_eq!(
        err(Recurrence::cron("0 0 1 1 * * 2030", None)),
        r#"invalid cron expression "0 0 1 1 * * 2030": expected 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading second; got 7"#
    );
    assert_eq!(
        err(Recurrence::cron("61 * * * *", None)),
        r#"invalid cron expression "61 * * * *": minute field "61": number out of bounds (allowed 0-59)"#
    );
    assert_eq!(
        err(Recurrence::cron("0 24 * * *", None)),
        r#"invalid cron expression "0 24 * * *": hour field "24": number out of bounds (allowed 0-23)"#
    );
    assert_eq!(
        err(Recurrence::cron("0 0 * * 8", None)),
        r#"invalid cron expression "0 0 * * 8": day-of-week field "8": number out of bounds (allowed 0-7 or SUN-SAT)"#
    );
    assert_eq!(
        err(Recurrence::cron("70 0 0 * * *", None)),
        r#"invalid cron expression "70 0 0 * * *": second field "70": number out of bounds (allowed 0-59)"#
    );
    assert_eq!(
        err(Recurrence::cron("0 0 * foo *", None)),
        r#"invalid cron expression "0 0 * foo *": month field "foo": illegal character"#
    );
    assert_eq!(
        err(Recurrence::cron("*/0 * * * *", None)),
        r#"invalid cron expression "*/0 * * * *": minute field "*/0": step cannot be zero"#
    );
    assert!(
        err(Recurrence::cron("5/15 * * * *", None))
            .starts_with(r#"invalid cron expression "5/15 * * * *": minute field "5/15": invalid step syntax"#)
    );
    assert_eq!(err(Recurrence::cron("  ", None)), r#"invalid cron expression "  ": empty"#);
    assert_eq!(
        err(Recurrence::cron("@reboot", None)),
        r#"invalid cron expression "@reboot": unknown nickname (expected @yearly, @annually, @monthly, @weekly, @daily, @hourly)"#
    );
    assert_eq!(
        err(Recurrence::cron("0 0 30 2 *", None)),
        r#"invalid cron expression "0 0 30 2 *": never matches any date"#
    );
    assert_eq!(err(Recurrence::cron("0 7 * * *", Some("Europe/Pariss"))), r#"unknown time zone "Europe/Pariss""#);
    assert_eq!(err(Recurrence::cron("0 7 * * *", Some(""))), r#"unknown time zone """#);
    assert_eq!(err(Recurrence::every("0s")), r#"invalid interval "0s": must be at least 1s"#);
    assert_eq!(err(Recurrence::every("999ms")), r#"invalid interval "999ms": must be at least 1s"#);
    assert_eq!(
        err(Recurrence::every("1s 500us")),
        r#"invalid interval "1s 500us": must be a whole number of milliseconds"#
    );
    assert!(err(Recurrence::every("soon")).starts_with(r#"invalid interval "soon": "#));
    assert!(err(Recurrence::every("")).starts_with(r#"invalid interval "": "#));
    assert_eq!(
        err("hourly".parse::<Recurrence>()),
        r#"invalid recurrence "hourly": expected `every <interval>` or `cron "<expression>" in <time zone>`"#
    );
    for e in [
        Recurrence::cron("61 * * * *", None).unwrap_err(),
        Recurrence::every("0s").unwrap_err(),
        Recurrence::cron("* * * * *", Some("Mars/Olympus")).unwrap_err(),
    ] {
        assert!(!e.to_string().contains('\n'));
    }
}

#[test]
fn display_round_trips() {
    let cases = [
        (cron("0 7 * * *", "Europe/Paris"), r#"cron "0 7 * * *" in Europe/Paris"#),
        (Recurrence::cron("@daily", None).unwrap(), r#"cron "@daily" in UTC"#),
        (cron("*/10 * 9-17 * * MON-FRI", "America/New_York"), r#"cron "*/10 * 9-17 * * MON-FRI" in America/New_York"#),
        (Recurrence::every("15m").unwrap(), "every 15m"),
        (Recurrence::every("1h30m").unwrap(), "every 1h 30m"),
        (Recurrence::every("1day 1s 5ms").unwrap(), "every 1day 1s 5ms"),
        (Recurrence::every("1month").unwrap(), "every 1month"),
    ];
    for (rec, text) in cases {
        assert_eq!(rec.to_string(), text);
        assert_eq!(text.parse::<Recurrence>().unwrap(), rec, "{text}");
    }
    assert_eq!(r#"cron "0 7 * * *""#.parse::<Recurrence>().unwrap(), cron("0 7 * * *", "UTC"));
    assert_ne!(cron("0 7 * * *", "UTC"), cron("0 7 * * *", "Europe/Paris"));
    assert!(matches!(r#"cron "0 7 * * *" at UTC"#.parse::<Recurrence>(), Err(RecurrenceError::Malformed { .. })));

    // serde goes through the same text.
    use serde::de::IntoDeserializer;
    use serde::de::value::{Error, StrDeserializer};
    let de: StrDeserializer<'_, Error> = "every 1h 30m".into_deserializer();
    assert_eq!(Recurrence::deserialize(de).unwrap(), Recurrence::Every(Duration::from_secs(5400)));
    let de: StrDeserializer<'_, Error> = "every 0s".into_deserializer();
    assert_eq!(Recurrence::deserialize(de).unwrap_err().to_string(), r#"invalid interval "0s": must be at least 1s"#);
    let de: StrDeserializer<'_, Error> = "skip".into_deserializer();
    assert_eq!(MissedPolicy::deserialize(de).unwrap(), MissedPolicy::Skip);
    assert_eq!(MissedPolicy::default(), MissedPolicy::Latest);
}

#[test]
fn next_after_utc_cron() {
    let rec = cron("0 7 * * *", "UTC");
    assert_eq!(rec.next_after(ms("2026-01-01T06:59:59.999Z")), Some(ms("2026-01-01T07:00:00Z")));
    // Strictly after: an occurrence at exactly `after` is not returned again.
    assert_eq!(rec.next_after(ms("2026-01-01T07:00:00Z")), Some(ms("2026-01-02T07:00:00Z")));
    assert_eq!(rec.next_after(ms("2026-01-01T07:00:00.001Z")), Some(ms("2026-01-02T07:00:00Z")));
    let weekdays = cron("0 9 * * MON-FRI", "UTC");
    // 2026-01-02 is a Friday.
    assert_eq!(weekdays.next_after(ms("2026-01-02T09:00:00Z")), Some(ms("2026-01-05T09:00:00Z")));
    let secs = cron("*/10 * * * * *", "UTC");
    assert_eq!(secs.next_after(ms("2026-01-01T00:00:05.500Z")), Some(ms("2026-01-01T00:00:10Z")));
    // Before the epoch too.
    assert_eq!(cron("0 0 * * *", "UTC").next_after(-1), Some(0));
    // POSIX: day-of-month OR day-of-week when both are restricted; `+` makes it AND.
    assert_eq!(cron("0 0 13 * FRI", "UTC").next_after(ms("2026-01-01T00:00:00Z")), Some(ms("2026-01-02T00:00:00Z")));
    assert_eq!(cron("0 0 13 * +FRI", "UTC").next_after(ms("2026-01-01T00:00:00Z")), Some(ms("2026-02-13T00:00:00Z")));
}

#[test]
fn next_after_every_is_anchored_to_the_previous_occurrence() {
    let rec = Recurrence::every("1h 30m").unwrap();
    let t = ms("2026-03-29T00:15:00.250Z");
    assert_eq!(rec.next_after(t), Some(t + 5_400_000));
    // No wall clock: the Paris DST change does not matter.
    let runs = between(&rec, t, t + 10 * 5_400_000);
    assert_eq!(runs.len(), 10);
    assert_steps(&runs, 5_400_000);
    assert_eq!(rec.next_after(i64::MAX - 1), None);
    assert_eq!(Recurrence::Every(Duration::ZERO).next_after(5), Some(6));
}

#[test]
fn daily_job_in_spring_forward_gap_runs_once_right_after_the_gap() {
    let rec = cron("30 2 * * *", "Europe/Paris");
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-28"), ["2026-03-28 02:30:00+01:00"]);
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-29"), ["2026-03-29 03:00:00+02:00"]);
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-30"), ["2026-03-30 02:30:00+02:00"]);
    let rec = cron("30 2 * * *", "America/New_York");
    assert_eq!(on_day(&rec, "America/New_York", "2026-03-08"), ["2026-03-08 03:00:00-04:00"]);
}

#[test]
fn daily_job_in_fall_back_fold_runs_once_on_the_first_pass() {
    let rec = cron("30 2 * * *", "Europe/Paris");
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-10-25"), ["2026-10-25 02:30:00+02:00"]);
    // Asked from inside the second pass, it does not run again that day.
    assert_eq!(rec.next_after(ms("2026-10-25T01:10:00Z")), Some(ms("2026-10-26T01:30:00Z")));
    // New York repeats 01:00-02:00.
    let rec = cron("30 1 * * *", "America/New_York");
    assert_eq!(on_day(&rec, "America/New_York", "2026-11-01"), ["2026-11-01 01:30:00-04:00"]);
}

#[test]
fn lists_and_ranges_follow_the_wall_clock_rules_too() {
    // croner alone would run 02:30 twice on fall-back day and skip it on spring-forward day.
    let rec = cron("30 2,14 * * *", "Europe/Paris");
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-29"), ["2026-03-29 03:00:00+02:00", "2026-03-29 14:30:00+02:00"]);
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-10-25"), ["2026-10-25 02:30:00+02:00", "2026-10-25 14:30:00+01:00"]);
    let rec = cron("0,30 2 * * *", "Europe/Paris");
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-29"), ["2026-03-29 03:00:00+02:00"]);
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-10-25"), ["2026-10-25 02:00:00+02:00", "2026-10-25 02:30:00+02:00"]);
    // A job due both in the gap and right after it still runs once there.
    let rec = cron("0 1-3 * * *", "Europe/Paris");
    assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-29"), ["2026-03-29 01:00:00+01:00", "2026-03-29 03:00:00+02:00"]);
    assert_eq!(
        on_day(&rec, "Europe/Paris", "2026-10-25"),
        ["2026-10-25 01:00:00+02:00", "2026-10-25 02:00:00+02:00", "2026-10-25 03:00:00+01:00"]
    );
}

#[test]
fn hourly_job_runs_every_real_hour_across_dst() {
    for (tz, spring, fall) in
        [("Europe/Paris", "2026-03-29", "2026-10-25"), ("America/New_York", "2026-03-08", "2026-11-01")]
    {
        let rec = cron("0 * * * *", tz);
        let zone = TimeZone::get(tz).unwrap();
        for (day, expected) in [(spring, 23), (fall, 25)] {
            let runs = on_day(&rec, tz, day);
            assert_eq!(runs.len(), expected, "{tz} {day}: {runs:?}");
            let date: Date = day.parse().unwrap();
            let start = date.to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
            let instants = between(&rec, start - 1, start + (expected as i64 - 1) * 3_600_000);
            assert_eq!(instants.len(), expected);
            assert_steps(&instants, 3_600_000); // no duplicate, no skipped instant
        }
    }
    let rec = cron("0 * * * *", "Europe/Paris");
    let fall = on_day(&rec, "Europe/Paris", "2026-10-25");
    assert_eq!(fall[2..4], ["2026-10-25 02:00:00+02:00", "2026-10-25 02:00:00+01:00"]);
}

#[test]
fn quarter_hourly_job_is_strictly_increasing_across_dst() {
    let rec = cron("*/15 * * * *", "Europe/Paris");
    for (day, expected) in [("2026-03-29", 92), ("2026-10-25", 100)] {
        assert_eq!(on_day(&rec, "Europe/Paris", day).len(), expected, "{day}");
    }
    let runs = between(&rec, ms("2026-03-28T22:00:00Z"), ms("2026-03-29T04:00:00Z"));
    assert_steps(&runs, 900_000);
    let runs = between(&rec, ms("2026-10-24T22:00:00Z"), ms("2026-10-25T04:00:00Z"));
    assert_steps(&runs, 900_000);
    assert_eq!(runs.len(), 24);
}

#[test]
fn a_year_of_a_daily_job_is_one_run_per_day() {
    for tz in ["Europe/Paris", "America/New_York", "UTC"] {
        let rec = cron("30 2 * * *", tz);
        let zone = TimeZone::get(tz).unwrap();
        let start = Date::new(2026, 1, 1).unwrap().to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
        let end = Date::new(2027, 1, 1).unwrap().to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
        let runs = between(&rec, start, end);
        assert_eq!(runs.len(), 365, "{tz}");
        let mut days: Vec<Date> =
            runs.iter().map(|&t| zone.to_datetime(Timestamp::from_millisecond(t).unwrap()).date()).collect();
        days.dedup();
        assert_eq!(days.len(), 365, "{tz}: one per local date");
    }
}

#[test]
fn catch_up_latest_runs_the_latest_missed_once() {
    let rec = cron("0 * * * *", "UTC");
    let due = ms("2026-05-01T00:00:00Z");
    let now = ms("2026-05-01T09:30:00Z"); // 00:00..=09:00 missed: 10
    let out = catch_up(&rec, due, now, MissedPolicy::Latest);
    assert_eq!(out, CatchUp { run_now: vec![ms("2026-05-01T09:00:00Z")], next_ms: Some(ms("2026-05-01T10:00:00Z")) });

    let every = Recurrence::every("1h").unwrap();
    let due = ms("2026-05-01T00:00:07Z");
    let out = catch_up(&every, due, due + 9 * 3_600_000 + 1_800_000, MissedPolicy::Latest);
    assert_eq!(out, CatchUp { run_now: vec![due + 9 * 3_600_000], next_ms: Some(due + 10 * 3_600_000) });
}

#[test]
fn catch_up_all_is_capped_to_the_latest() {
    let every = Recurrence::every("1s").unwrap();
    let out = catch_up(&every, 0, 5_000_500, MissedPolicy::All); // 5001 missed
    assert_eq!(out.run_now.len(), MAX_CATCH_UP);
    assert_eq!(out.run_now.first(), Some(&4_001_000));
    assert_eq!(out.run_now.last(), Some(&5_000_000));
    assert_steps(&out.run_now, 1000);
    assert_eq!(out.next_ms, Some(5_001_000));

    let secs = cron("* * * * * *", "UTC");
    let out = catch_up(&secs, 0, 5_000_500, MissedPolicy::All);
    assert_eq!(
        (out.run_now.len(), out.run_now[0], out.run_now[999], out.next_ms),
        (1000, 4_001_000, 5_000_000, Some(5_001_000))
    );

    // A year-long outage of a per-minute job costs ~1000 steps, not 500k.
    let minutely = cron("* * * * *", "Europe/Paris");
    let (due, now) = (ms("2025-06-01T00:00:00Z"), ms("2026-06-01T00:00:30Z"));
    let out = catch_up(&minutely, due, now, MissedPolicy::All);
    assert_eq!(out.run_now.len(), MAX_CATCH_UP);
    assert_eq!(out.run_now.last(), Some(&ms("2026-06-01T00:00:00Z")));
    assert_steps(&out.run_now, 60_000);

    let out = catch_up(&rec3(), ms("2026-05-01T00:00:00Z"), ms("2026-05-01T02:00:00Z"), MissedPolicy::All);
    assert_eq!(out.run_now, [ms("2026-05-01T00:00:00Z"), ms("2026-05-01T01:00:00Z"), ms("2026-05-01T02:00:00Z")]);
    assert_eq!(out.next_ms, Some(ms("2026-05-01T03:00:00Z")));
}

fn rec3() -> Recurrence {
    cron("0 * * * *", "UTC")
}

#[test]
fn catch_up_skip_runs_only_an_occurrence_within_the_grace() {
    let due = ms("2026-05-01T00:00:00Z");
    let out = catch_up(&rec3(), due, ms("2026-05-01T09:30:00Z"), MissedPolicy::Skip);
    assert_eq!(out, CatchUp { run_now: vec![], next_ms: Some(ms("2026-05-01T10:00:00Z")) });
    // A poll 5s late is on time, not missed.
    let out = catch_up(&rec3(), due, due + 5_000, MissedPolicy::Skip);
    assert_eq!(out, CatchUp { run_now: vec![due], next_ms: Some(ms("2026-05-01T01:00:00Z")) });
    let every = Recurrence::every("10m").unwrap();
    let out = catch_up(&every, due, due + 35 * 60_000, MissedPolicy::Skip);
    assert_eq!(out, CatchUp { run_now: vec![], next_ms: Some(due + 40 * 60_000) });
}

#[test]
fn catch_up_with_nothing_missed_or_due_exactly_now() {
    let due = ms("2026-05-01T10:00:00Z");
    for policy in [MissedPolicy::Latest, MissedPolicy::All, MissedPolicy::Skip] {
        for rec in [rec3(), Recurrence::every("1h").unwrap()] {
            let out = catch_up(&rec, due, due - 1, policy);
            assert_eq!(out, CatchUp { run_now: vec![], next_ms: Some(due) }, "{rec} {policy:?}");
            let out = catch_up(&rec, due, due, policy);
            assert_eq!(out, CatchUp { run_now: vec![due], next_ms: Some(due + 3_600_000) }, "{rec} {policy:?}");
        }
    }
}

#[test]
fn catch_up_across_fall_back_keeps_the_wall_clock_rules() {
    let (due, now) = (ms("2026-10-24T00:30:00Z"), ms("2026-10-26T12:00:00Z"));
    for expr in ["30 2 * * *", "30 2,14 * * *"] {
        let rec = cron(expr, "Europe/Paris");
        let all = catch_up(&rec, due, now, MissedPolicy::All);
        assert_eq!(all.run_now, between(&rec, due - 1, now), "{expr}");
        assert!(!all.run_now.contains(&ms("2026-10-25T01:30:00Z")), "{expr}: no second 02:30");
    }
    // The latest missed one is found even when croner's latest is the dropped second pass.
    let rec = cron("30 2,14 * * *", "Europe/Paris");
    let out = catch_up(&rec, due, ms("2026-10-25T01:45:00Z"), MissedPolicy::Latest);
    assert_eq!(out.run_now, [ms("2026-10-25T00:30:00Z")]);
    assert_eq!(out.next_ms, Some(ms("2026-10-25T13:30:00Z")));
    let rec = cron("0-59 0-59 2 * * *", "Europe/Paris");
    let out = catch_up(&rec, due, ms("2026-10-25T01:45:00Z"), MissedPolicy::Latest);
    assert_eq!(out.run_now, [ms("2026-10-25T00:59:59Z")]);
}

const EXPRS: [&str; 10] = [
    "*/15 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "30 2,14 * * *",
    "0,30 1-3 * * *",
    "*/7 */3 * * *",
    "0 0 * * MON",
    "*/20 * * * * *",
    "15 2 L * *",
    "0 0-23/5 * * *",
];
const ZONES: [&str; 6] =
    ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata"];

#[test]
fn property_next_after_is_strictly_increasing() {
    let start = ms("2026-02-20T00:00:00Z");
    for expr in EXPRS {
        for tz in ZONES {
            let rec = cron(expr, tz);
            let Recurrence::Cron { compiled, .. } = &rec else { unreachable!() };
            let zone = TimeZone::get(tz).unwrap();
            let mut t = start;
            let mut wall = zone.to_datetime(Timestamp::from_millisecond(t).unwrap());
            for i in 0..2000 {
                let n = rec.next_after(t).unwrap_or_else(|| panic!("{expr} {tz}: ended at {i}"));
                assert!(n > t, "{expr} in {tz}: {n} after {t}");
                if compiled.wall_clock {
                    // A wall-clock job never repeats a wall-clock time.
                    let w = zone.to_datetime(Timestamp::from_millisecond(n).unwrap());
                    assert!(w > wall, "{expr} in {tz}: {w} after {wall}");
                    wall = w;
                }
                t = n;
            }
        }
    }
}

#[test]
fn property_catch_up_all_matches_stepping_forward() {
    // Windows around the 2026 transitions, in both hemispheres.
    let windows = [
        ("2026-03-28T12:00:00Z", "2026-03-29T12:00:00Z"),
        ("2026-10-24T12:00:00Z", "2026-10-25T12:00:00Z"),
        ("2026-04-04T00:00:00Z", "2026-04-06T00:00:00Z"),
        ("2026-09-05T00:00:00Z", "2026-09-07T00:00:00Z"),
        ("2026-03-07T12:00:00Z", "2026-03-08T12:00:00Z"),
        ("2026-10-31T12:00:00Z", "2026-11-01T12:00:00Z"),
    ];
    for expr in EXPRS {
        for tz in ZONES {
            let rec = cron(expr, tz);
            for (from, to) in windows {
                let (from, to) = (ms(from), ms(to));
                let Some(due) = rec.next_after(from) else {
                    continue;
                };
                let mut expected = vec![due];
                expected.extend(between(&rec, due, to));
                if expected.last() > Some(&to) {
                    continue;
                }
                let keep = expected.len().saturating_sub(MAX_CATCH_UP);
                let out = catch_up(&rec, due, to, MissedPolicy::All);
                assert_eq!(out.run_now, expected[keep..], "{expr} in {tz}");
                assert_eq!(out.next_ms, rec.next_after(to), "{expr} in {tz}");
                let latest = catch_up(&rec, due, to, MissedPolicy::Latest);
                assert_eq!(latest.run_now, expected[expected.len() - 1..], "{expr} in {tz}");
            }
        }
    }
}
