// Drives kp::wgmma_find_tile_page (kernels/kpool_index_wgmma.cuh: the page
// of a 64-pool key tile that lies in one page, and a row's entry in it) over
// an array of cases, one thread each, so tests/test_page_size.py can compare
// every page and entry with exact integer division on the emulator.
__global__ void tile_pages(const long long* __restrict__ block_sizes, const long long* __restrict__ first_pools,
                           const long long* __restrict__ reaches, const unsigned int* __restrict__ rows,
                           long long count, const int* __restrict__ table_row, long long table_columns,
                           int* __restrict__ pages, unsigned int* __restrict__ entries) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const kp::TilePage at = kp::wgmma_find_tile_page(first_pools[i], reaches[i], table_row, table_columns,
                                                     kp::page_size_of(block_sizes[i]), rows[i]);
    pages[i] = at.page;
    entries[i] = at.entry;
}
