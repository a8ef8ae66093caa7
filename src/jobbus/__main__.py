from jobbus.cli import main

main()
