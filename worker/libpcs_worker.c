/* libpcs_worker.so has no code of its own: it is the static worker libraries linked whole, with
 * the exports of libpcs_worker.map (worker/CMakeLists.txt). */
typedef int pcs_worker_shared_library;
