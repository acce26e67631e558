/* The entry point of a C program built as a shared library for warpfleet's persistent runner
 * (wf_entry.cpp is the C++/CUDA one). The build renames `main` to `wf_user_main`; C linkage does
 * not encode the parameters, so one declaration serves `int main(void)` too. */
int wf_user_main(int argc, char** argv);

int wf_entry(int argc, char** argv) { return wf_user_main(argc, argv); }
