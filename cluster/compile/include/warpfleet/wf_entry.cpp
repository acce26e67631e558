// The entry point of a program built as a shared library for warpfleet's persistent runner.
// The build renames the program's `main` to `wf_user_main` (-Dmain=wf_user_main) and adds this
// file; the runner's host process loads the library and calls wf_entry(argc, argv) in place of a
// process start. C++ gives the renamed main C++ linkage, in either of its two standard forms:
// whichever the program defines is found (weak references), the other stays null.
int wf_user_main(int argc, char** argv) __attribute__((weak));
int wf_user_main() __attribute__((weak));

extern "C" int wf_entry(int argc, char** argv) {
    int (*with_arguments)(int, char**) = wf_user_main;
    int (*without_arguments)() = wf_user_main;
    if (with_arguments) return with_arguments(argc, argv);
    if (without_arguments) return without_arguments();
    return 127;  // no main in the library
}
