//! Dead letters: list, requeue and purge, a dead id scheduled again, and dead letters at claim for size.

use crate::support::{RedisServer, key, redis_now, store, ty};
use hourglass_store::ClaimLimits;
use hourglass_store::task::{Ended, Outcome, Settlement};
use redis::Commands;

use super::{hget, ids, zscore};

#[tokio::test(flavor = "multi_thread")]
async fn dead_letter_list_requeue_and_purge() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("doomed");
    let now = redis_now(&mut c);
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let _: () = c.zadd(key("doomed", "due"), *id, now - 10 + i as i64).unwrap();
        let _: () = c.hset(key("doomed", "payload"), *id, "12345").unwrap();
    }
    let tasks = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks;
    let batch: Vec<Settlement> = tasks
        .iter()
        .map(|task| Settlement {
            lease: task.lease(),
            outcome: Outcome::Dead { error: format!("bad {}", String::from_utf8_lossy(&task.id)) },
            run: Default::default(),
        })
        .collect();
    let r = s.settle(&t, &batch, None).await.unwrap().0;
    assert_eq!(r, vec![Ended::Dead; 3]);

    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.dead, stats.dead_total, stats.failed, stats.in_flight), (3, 3, 3, 0));
    let dead = s.dead_list(&t, 10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert_eq!(dead[0].id, b"a");
    assert_eq!(dead[0].error, "bad a");
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(dead[0].payload_len, 5);
    assert!(dead[0].died_ms >= now);
    assert_eq!(s.dead_list(&t, 1).await.unwrap().len(), 1);
    assert!(s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.is_empty());

    // Requeue one: due now, attempts reset, payload kept.
    assert_eq!(s.dead_requeue(&t, Some(&[b"a".to_vec(), b"nope".to_vec()])).await.unwrap(), 1);
    let again = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks;
    assert_eq!(ids(&again), vec![b"a".to_vec()]);
    assert_eq!((again[0].attempt, again[0].payload.as_slice()), (1, b"12345".as_slice()));
    assert_eq!(hget(&mut c, &key("doomed", "errors"), b"a"), None);

    // Purge one by id, then the rest.
    assert_eq!(s.dead_purge(&t, Some(&[b"b".to_vec()])).await.unwrap(), 1);
    assert_eq!(hget(&mut c, &key("doomed", "payload"), b"b"), None);
    assert_eq!(hget(&mut c, &key("doomed", "errors"), b"b"), None);
    assert_eq!(s.dead_purge(&t, None).await.unwrap(), 1);
    assert!(s.dead_list(&t, 10).await.unwrap().is_empty());
    assert_eq!(hget(&mut c, &key("doomed", "payload"), b"c"), None);
    assert_eq!(s.dead_purge(&t, None).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn requeue_all_moves_more_than_one_batch() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("many");
    let mut pipe = redis::pipe();
    for i in 0..2500 {
        pipe.zadd(key("many", "dead"), format!("d{i}"), i).ignore();
        pipe.hset(key("many", "attempts"), format!("d{i}"), 5).ignore();
    }
    let () = pipe.query(&mut c).unwrap();
    assert_eq!(s.dead_requeue(&t, None).await.unwrap(), 2500);
    let due: usize = c.zcard(key("many", "due")).unwrap();
    let attempts: usize = c.hlen(key("many", "attempts")).unwrap();
    assert_eq!((due, attempts), (2500, 0));
    assert_eq!(s.stats(&t).await.unwrap().dead, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_schedule_of_a_dead_id_revives_it_fresh() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("phoenix");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("phoenix", "dead"), "x", now - 100).unwrap();
    let _: () = c.hset(key("phoenix", "attempts"), "x", 5).unwrap();
    let _: () = c.hset(key("phoenix", "errors"), "x", "old failure").unwrap();
    let _: () = c.zadd(key("phoenix", "due"), "x", now - 1).unwrap();
    let task = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!(task.attempt, 1);
    assert!(zscore(&mut c, &key("phoenix", "dead"), b"x").is_none());
    assert_eq!(hget(&mut c, &key("phoenix", "errors"), b"x"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversize_payload_and_long_id_are_dead_lettered_at_claim() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("big");
    let now = redis_now(&mut c);
    let long_id = vec![b'i'; 1025];
    let _: () = c.zadd(key("big", "due"), "fat", now - 3).unwrap();
    let _: () = c.hset(key("big", "payload"), "fat", vec![7u8; 2000]).unwrap();
    let _: () = c.zadd(key("big", "due"), &long_id, now - 2).unwrap();
    let _: () = c.zadd(key("big", "due"), "fine", now - 1).unwrap();
    let _: () = c.hset(key("big", "payload"), "fine", vec![7u8; 1000]).unwrap();

    let claim = s.claim(&t, &ClaimLimits { max_payload_bytes: 1000, ..ClaimLimits::default() }).await.unwrap();
    assert_eq!(ids(&claim.tasks), vec![b"fine".to_vec()]);
    assert_eq!(claim.dead_lettered.len(), 2);
    assert_eq!(claim.dead_lettered[0].0, b"fat");
    assert_eq!(claim.dead_lettered[0].1, "payload of 2000 bytes is over the 1000-byte limit");
    assert_eq!(claim.dead_lettered[1].0, long_id);
    assert_eq!(claim.dead_lettered[1].1, "id of 1025 bytes is over the 1024-byte limit");

    let dead = s.dead_list(&t, 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    let fat = dead.iter().find(|d| d.id == b"fat").unwrap();
    assert!(fat.error.contains("2000 bytes"), "{}", fat.error);
    assert_eq!(fat.payload_len, 2000);
    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.dead, stats.dead_total, stats.in_flight, stats.due_now), (2, 2, 1, 0));
}
