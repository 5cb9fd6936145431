//! Hourglass: resetting a store's instances to the state they had just after
//! instantiation, instead of instantiating again.
//!
//! Not part of upstream wasmtime; see `vendor/README.md` in Hourglass.

use crate::prelude::*;
use crate::runtime::component::ComponentInstanceId;
use crate::runtime::vm;
use crate::store::{InstanceId, StoreId};
use crate::AsContextMut;

/// The state of every instance in a [`Store`](crate::Store), recorded so the
/// store can be put back in it: each core instance's globals, tables,
/// element and data segments and linear memories, and each component
/// instance's flags and handle tables.
///
/// A checkpoint is taken just after instantiation, before any call; after
/// each call the store is [restored](Checkpoint::restore) instead of a new
/// instance being made. A restored instance cannot tell it ran before: what
/// wasm can write or observe is back as it was at the checkpoint.
///
/// Linear memory is reset like the pooling allocator resets a slot: the
/// pages written since are found with the pagemap scan (Linux) and copied
/// back from a copy-on-write image of the memory at the checkpoint, or given
/// back to the kernel past `linear_memory_keep_resident`.
///
/// What is *not* reset is the host's own state: the store's data `T`, fuel
/// and the epoch deadline are the embedder's to set again. A store whose
/// instance trapped cannot be restored (nor checkpointed): drop it.
///
/// Requires the pooling allocator. Fails with an error for what it cannot
/// reset: shared memories, GC references in globals, tables or element
/// segments, and handles the host holds (`ResourceAny`).
pub struct Checkpoint {
    store: StoreId,
    instances: Vec<(InstanceId, vm::InstanceCheckpoint)>,
    components: Vec<(ComponentInstanceId, vm::component::ComponentCheckpoint)>,
}

impl Checkpoint {
    /// Records the state of every instance in `store`.
    ///
    /// Each linear memory is moved onto a copy-on-write image of its current
    /// contents. Where `like` is a checkpoint of another store instantiated
    /// from the same component and a memory's contents are the same, its
    /// image is shared instead of copied.
    ///
    /// Must not be called while wasm runs in `store` (from a host function).
    pub fn take(mut store: impl AsContextMut, like: Option<&Checkpoint>) -> Result<Checkpoint> {
        let store = store.as_context_mut().0;
        Self::check(store)?;
        let engine = store.engine().clone();
        let Some(pool) = engine.allocator().as_pooling() else {
            bail!("checkpoints need the pooling allocator");
        };
        let reset = pool.reset_params(engine.tunables());
        let mut instances = Vec::new();
        for (i, id) in store.instance_ids().into_iter().enumerate() {
            let like = like.and_then(|like| like.instances.get(i)).map(|(_, c)| c);
            let checkpoint = store.instance_mut(id).checkpoint(like, &reset)?;
            instances.push((id, checkpoint));
        }
        let mut components = Vec::new();
        for id in store.component_instance_ids() {
            components.push((id, store.store_data().component_instance(id).checkpoint()?));
        }
        Ok(Checkpoint { store: store.id(), instances, components })
    }

    /// Puts every instance in `store` back in the state recorded.
    ///
    /// On error the store must be dropped: it may be partly reset.
    ///
    /// Must not be called while wasm runs in `store` (from a host function).
    pub fn restore(&self, mut store: impl AsContextMut) -> Result<()> {
        let store = store.as_context_mut().0;
        if store.id() != self.store {
            bail!("a checkpoint restored into another store");
        }
        Self::check(store)?;
        if store.instance_ids().len() != self.instances.len()
            || store.component_instance_ids().len() != self.components.len()
        {
            bail!("instances were added to the store after its checkpoint");
        }
        let engine = store.engine().clone();
        let Some(pool) = engine.allocator().as_pooling() else {
            bail!("checkpoints need the pooling allocator");
        };
        let reset = pool.reset_params(engine.tunables());
        for (id, checkpoint) in &self.instances {
            store.instance_mut(*id).restore(checkpoint, &reset)?;
        }
        let mut emptied = 0;
        for (id, checkpoint) in &self.components {
            emptied += store.store_data_mut().component_instance_mut(*id).restore(checkpoint);
        }
        store.forget_component_handles(emptied);
        Ok(())
    }

    /// Bytes of host memory the checkpoint holds, its memory images included
    /// (counted in full even where shared with another checkpoint).
    pub fn host_bytes(&self) -> usize {
        self.instances.iter().map(|(_, c)| c.host_bytes()).sum()
    }

    fn check(store: &mut crate::store::StoreOpaque) -> Result<()> {
        if store.trapped() {
            bail!("an instance in this store trapped");
        }
        if !store.component_host_table_is_empty() {
            bail!("the host holds component handles (`ResourceAny`) in this store");
        }
        if store.optional_gc_store_mut().is_some() {
            bail!("this store has a GC heap");
        }
        Ok(())
    }
}
