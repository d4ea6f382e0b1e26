// The persistent device block tables, brought up to date before a step: the entries that
// changed since the last step (blocks appended to a request's row, rows written for new or
// moved requests) arrive as (index, block id) pairs in the step's metadata and are scattered in
// one launch, so a step never re-uploads whole tables.
struct BlockTableUpdateParams {
  int* table;         // [num_rows, max_blocks] block ids, row-major
  const int* index;   // [num_updates] row * max_blocks + column, distinct within a launch
  const int* value;   // [num_updates] block id
  int num_updates;
};

// grid-stride; any grid
extern "C" __global__ void block_table_update(BlockTableUpdateParams p) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.num_updates; i += gridDim.x * blockDim.x) {
    p.table[p.index[i]] = p.value[i];
  }
}
