// The whole workgroup (256 threads) folding one value per thread: `fold_sum(lid, v)` and
// `fold_max(lid, v)` return the workgroup's total to every thread. Here a tree in workgroup memory,
// eight halving steps with a barrier each; `row_tree_subgroup.wgsl` is the same API on subgroup
// operations where the adapter has them.

var<workgroup> partial: array<f32, 256>;

fn row_fold(lid: u32, value: f32, is_max: bool) -> f32 {
    partial[lid] = value;
    workgroupBarrier();
    for (var width = 128u; width > 0u; width >>= 1u) {
        if (lid < width) {
            let other = partial[lid + width];
            partial[lid] = select(partial[lid] + other, max(partial[lid], other), is_max);
        }
        workgroupBarrier();
    }
    let total = partial[0];
    workgroupBarrier();
    return total;
}

fn fold_sum(lid: u32, value: f32) -> f32 {
    return row_fold(lid, value, false);
}

fn fold_max(lid: u32, value: f32) -> f32 {
    return row_fold(lid, value, true);
}
