// Drives kp::PageSize (kernels/kpool_index.cuh: a division by the page size
// as a multiply and a shift) and kp::find_key_pages over arrays of cases,
// one thread each, so tests/test_page_size.py can compare every quotient,
// page and entry with exact integer division on the emulator and on a GPU.
__global__ void page_quotients(const long long* __restrict__ block_sizes, const unsigned int* __restrict__ pools,
                               long long count, unsigned int* __restrict__ quotients) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) quotients[i] = kp::page_size_of(block_sizes[i]).quotient(pools[i]);
}

// Case i: the pages and entries of pools first_pools[i] + STEP n (n < 4) below
// reaches[i], from a table row of table_columns entries.
template <int STEP>
__device__ __forceinline__ void key_pages(const long long* block_sizes, const long long* first_pools,
                                          const long long* reaches, long long count, const int* table_row,
                                          long long table_columns, int* pages, unsigned int* entries) {
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    kp::KeyPages<4> at;
    kp::find_key_pages<4, STEP>(first_pools[i], reaches[i], table_row, table_columns,
                                kp::page_size_of(block_sizes[i]), 0, at);
    for (int n = 0; n < 4; ++n) {
        pages[4 * i + n] = at.page[n];
        entries[4 * i + n] = at.entry[n];
    }
}

#define KP_KEY_PAGES(STEP)                                                                                          \
    __global__ void key_pages_step##STEP(const long long* __restrict__ block_sizes,                                 \
                                         const long long* __restrict__ first_pools,                                 \
                                         const long long* __restrict__ reaches, long long count,                    \
                                         const int* __restrict__ table_row, long long table_columns,                \
                                         int* __restrict__ pages, unsigned int* __restrict__ entries) {             \
        key_pages<STEP>(block_sizes, first_pools, reaches, count, table_row, table_columns, pages, entries);        \
    }
KP_KEY_PAGES(8)   // the mma.sync paths' lane step
KP_KEY_PAGES(16)  // kp::WgmmaKeyPart<128>::kRowStep
KP_KEY_PAGES(32)  // kp::WgmmaKeyPart<64>::kRowStep
